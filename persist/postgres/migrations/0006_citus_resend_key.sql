-- 0006: nothing on plain PostgreSQL. The version is taken by
-- migrations_citus/0006_citus_resend_key.sql (a file there replaces the
-- file of the same version here; TestCitusMigrationsReplacePlainOnes).
SELECT 1;
