"""LibreTranslate's and DeepL v2's APIs on the served models: their routes, their shared translation path and the
signed file links. The wing talks to the service core only through `TranslationBackend` (service/compat/backend.py).
"""
