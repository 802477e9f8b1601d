"""jaxrl.models"""
