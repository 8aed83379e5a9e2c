"""Other trainers' runs: TRL and ART monitors, importers, `watch`, the W&B mirror."""
