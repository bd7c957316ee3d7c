"""Documents in, documents out: files read into the text segments they hold, translated as jobs in the shared
store, and written back in their own format with their structure kept."""
