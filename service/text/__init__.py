"""Text processing shared by /v1 and the compatibility routes: language codes and detection, sentence
splitting, HTML markup and inline tags. Plain functions on strings; depends on no other part of service/.
"""
