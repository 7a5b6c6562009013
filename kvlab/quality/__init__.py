"""How much a cache changes the model's predictions: streaming perplexity, the quality report and its statistics.

`kvlab.quality.stats` holds the pure statistics (the figures llama.cpp's `llama-perplexity --kl-divergence`
prints against a dense run, Wilson intervals, the Pareto front); the modules that run a model live beside it.
"""
