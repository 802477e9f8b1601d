"""jaxrl.rl"""
