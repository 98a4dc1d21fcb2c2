# Prometheus for deploy/compose.yaml on a machine without registries (deploy/local/image.sh
# compose): Debian's package, started as the prom/prometheus image starts it.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
