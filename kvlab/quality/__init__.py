"""How much a cache changes the model's predictions: streaming perplexity, the quality report and its statistics.

`perplexity` streams a long text token by token through several caches in turns (StreamingLLM's figure);
`stats` computes the figures `llama-perplexity --kl-divergence` prints (PPL ratio, ΔPPL, KL, same top p) and
Wilson intervals.
No gradio, no plotting: the tabs are in `kvlab.ui`.
"""
