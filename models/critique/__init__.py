"""Critique-and-route controller (paper 002) and CoRL budget modes (paper 003), trained with our own
policy-gradient code on logged outcomes: env (states, masks, features), rewards (eq. 1/3; CoRL eq. 5–7),
policy (MLP over frozen embeddings), grpo (Algorithm 1's tree GRPO, multipliers), corl (PPO + GAE),
evaluate (greedy decoding, usage-budget pass-through, APGR)."""
