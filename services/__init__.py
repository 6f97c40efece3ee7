"""Local stand-ins for external services (a real Kafka broker, ...) that tests and demos start as processes.

Why processes and not containers: the project must run where no Docker engine exists; a JVM and Maven do.
"""
