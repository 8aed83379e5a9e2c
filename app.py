"""GRPO Health: the Streamlit entry point.

`python -m grpo_core serve` (or `make run`) starts it; `streamlit run app.py` works too.
The app itself is grpo_core.dashboard.frame.main(): page config, token gate, run picker
(sidebar, or `?run=<id>` in the URL) and the navigation to pages/*.py, each of which
opens with frame.open_page(); frame.py's docstring says how legacy pages/ routing is
handled. It never imports torch: training happens in a separate trainer process that
writes the run store this dashboard reads.
"""
from grpo_core.dashboard import frame

if __name__ == "__main__":  # Streamlit runs this file as __main__ on every script run
    frame.main()
