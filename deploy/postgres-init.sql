-- orders and payment each own a database; the image creates the first (POSTGRES_DB).
CREATE DATABASE payment OWNER chain;
