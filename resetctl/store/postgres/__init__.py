"""The PostgreSQL backend, for sweeps on many hosts over one database: its connection
(``backend``, over psycopg in ``connection``), its dialect (``dialect``), its schema with
migrations (``schema``, over ``schema.sql`` beside it), and `db copy` (``copy``)."""
