"""jaxrl.envs"""
