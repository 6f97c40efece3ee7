# The spark-trickle pipeline job: `docker build -t spark-trickle .` then
#   docker run --rm -v "$PWD/conf:/conf:ro" -v trickle-data:/data spark-trickle run /conf/compose.yaml
# docker-compose.yml builds and runs it as the `pipeline` service.
#
# Python 3.11 + a Java 17 JDK (Spark 4.1 needs 17+) + Maven, which `./dev setup` uses once, at build time,
# to fetch the Delta and Kafka jars into jars/lib. The image then runs offline.
FROM python:3.11-slim-bookworm

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

# procps: Spark's launch scripts call `ps`. The man1 folder: the JDK's postinst links man pages into it,
# and slim images leave it out.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jdk-headless maven procps \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# .dockerignore keeps a local .venv/, jars/lib/, warehouse and caches out of the build context, so the
# bootstrap below starts from a clean tree exactly like a fresh clone.
COPY . /app

# Bootstrap as on a developer machine: .venv with `pip install -e '.[test]'`, then the jars via Maven.
# Maven's local repository is only needed for that fetch.
RUN bash ./dev setup && rm -rf /root/.m2

# Run as an unprivileged user; /data (warehouse, checkpoints) is where the compose file mounts its volume,
# created here so that a new named volume inherits the ownership.
RUN useradd --create-home --uid 10001 trickle \
    && mkdir -p /data \
    && chown trickle:trickle /data
USER trickle

ENV PATH=/app/.venv/bin:$PATH \
    TRICKLE_WAREHOUSE=/data/warehouse

ENTRYPOINT ["/app/.venv/bin/trickle"]
CMD ["--help"]
