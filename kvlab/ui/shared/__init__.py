"""What every tab of the page shares: the strategy card and its knobs, the model picker, background loading,
the live plots and their data frames, the matplotlib figures, the view-code snippets, the theme, exports,
the link into Inspect. A tab's own package imports from here; nothing here imports a tab. How the app is served
(agent tools, run costs and turns, queue, shutdown, ZeroGPU) is `kvlab.ui.hosting`'s."""
