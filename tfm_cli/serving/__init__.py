"""`tfm serve`: loaded models behind the DeepL v2, LibreTranslate and tfm's own HTTP APIs.

models.py (which model a request's languages name), glossaries.py (the DeepL glossaries in SQLite),
engine.py (one thread per model: dynamic batching through inference.translation.Translator),
requests.py (bodies, fields, keys and limits), app.py (the routes). A library: it never prints;
the command hands it a function for its log lines.
"""
