"""What a run's numbers say: health statistics, alerts, the autopilot's policy, figures and reports. No torch."""
