"""How much a cache changes the model's predictions: streaming perplexity, the quality report and its statistics.

`perplexity` streams a long text token by token through several caches in turns (StreamingLLM's figure).
No gradio, no plotting: the tabs are in `kvlab.ui`.
"""
