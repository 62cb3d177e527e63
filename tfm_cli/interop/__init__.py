"""Other engines' formats: importing Hugging Face MarianMT / OPUS-MT folders (marian_import) and exporting
to MarianMT and CTranslate2 (exporting)."""
