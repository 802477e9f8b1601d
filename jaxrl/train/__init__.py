"""jaxrl.train"""
