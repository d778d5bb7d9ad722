-- See the PostgreSQL migration of the same name.
CREATE TABLE oncely_development_secret (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    secret TEXT NOT NULL
);
