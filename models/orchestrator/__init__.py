"""The learnable orchestrator of paper 004 (Uno-Orchestra): the LM controller (lm.py), its settings
(config.py) and supervised fine-tuning on teacher trajectories (sft.py, sft_data.py)."""
