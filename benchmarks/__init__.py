"""The repository's bench sections that stay out of the installed package: the app through its API and a
headless browser against the CLI (`app_section`, `app_browser`, `cpu_share`; they need the test-only packages
gradio_client and Playwright and a system Chromium). `python -m benchmarks` (`make bench`) runs kvlab's bench
with them registered."""
