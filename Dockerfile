# The purgatory service: `purgatory serve`, configured by PURGATORY_* variables.
#   docker build -t purgatory:0.1.0 .
#   docker run --rm -p 8080:8080 -e PURGATORY_KAFKA_BOOTSTRAP_SERVERS=broker:9092 purgatory:0.1.0
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed numeric user, so that Kubernetes can check runAsNonRoot without reading /etc/passwd.
RUN groupadd --system --gid 10001 purgatory \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin purgatory

WORKDIR /src
COPY pyproject.toml README.md ./
COPY purgatory/ purgatory/
COPY reaper/ reaper/
COPY spark_bridge/ spark_bridge/
RUN pip install '.[service]'

WORKDIR /
USER 10001:10001
# Listen on every interface of the container (the service's own default is loopback).
ENV PURGATORY_HTTP_HOST=0.0.0.0 \
    PURGATORY_HTTP_PORT=8080
EXPOSE 8080
ENTRYPOINT ["purgatory", "serve"]
