"""The run store contract and the settings a run carries: who writes a run, who reads it, what a request is. No torch."""
