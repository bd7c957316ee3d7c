"""LibreTranslate's and DeepL v2's APIs on the served models: their routes (documents and glossaries among them)
and their shared translation path. The wing talks to the service core only through `TranslationBackend`
(service/compat/backend.py).
"""
