"""How the app is served, apart from what the page shows: the agent tools (`tools`: the API endpoints gradio's
MCP server lists), what a run costs (`costs`) and its turn under kvlab's scheduler (`turns`), the queue's polling
and the server's prompt close (`server`), the SIGTERM path (`shutdown`) and ZeroGPU's wrapping of GPU-bound entry
points (`zerogpu`). Tabs and `kvlab.ui.shared` import from here; this package imports neither, and nothing here
imports the CLI: each tool calls its wing's request-to-record path."""
