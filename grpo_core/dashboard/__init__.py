"""What the Streamlit pages read and do: the page frame, view models, widget state, starting and stopping processes, the access gate. No torch."""
