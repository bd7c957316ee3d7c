"""The translation microservice: a Ray Serve application around model.Translator. The ingress (service/app.py)
speaks HTTP, one translator deployment per model (service/deployments.py) batches and decodes; no tensor math here.
"""
