"""Files and streams: `-` for stdin/stdout, UTF-8 line reading with clear errors, atomic writes.

Every command that takes a path goes through here, so `-`, CRLF handling, invalid UTF-8 and
"no half-written output file" behave the same everywhere.

- paths.py: inputs checked before any work, output folders, file hashes.
- streams.py: reading lines (stdin or a file, a threaded reader, parallel files).
- atomic_files.py: writing a file whole or not at all, keeping its permissions.
- output_lines.py: output lines and JSON lines that line-based readers read back as one line.
"""
