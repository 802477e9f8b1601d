"""jaxrl.rollout"""
