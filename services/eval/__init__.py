"""Evaluation: the agent and its baselines over the live services, scored per question and summarised."""
