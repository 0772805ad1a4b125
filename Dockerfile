# graphsink container image. Untested here (no Docker engine on the dev
# machine); see docker-compose.yml.
FROM rust:1.95-bookworm AS build
# protoc for lance's build; OpenSSL headers + pkg-config for rdkafka's "ssl".
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends protobuf-compiler libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p graphsink \
 && cp target/release/graphsink /usr/local/bin/graphsink

FROM debian:bookworm-slim
# libssl3: graphsink links the system OpenSSL dynamically. curl: the compose
# healthcheck asks `/ready` (served with `run --http ADDR`).
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates libssl3 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /var/lib/graphsink graphsink \
 && mkdir -p /var/lib/graphsink/graph \
 && chown -R graphsink:graphsink /var/lib/graphsink
COPY --from=build /usr/local/bin/graphsink /usr/local/bin/graphsink
USER graphsink
ENTRYPOINT ["graphsink"]
CMD ["run", "--config", "/etc/graphsink/social.toml"]
