"""The embedded backend, one SQLite file: its connection (``backend``), its dialect
(``dialect``) and its schema with migrations (``schema``, over the top-level schema.sql)."""
