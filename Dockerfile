# Builds both binaries; compose.yaml runs them.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p planner -p worker

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates tzdata && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/planner /src/target/release/worker /usr/local/bin/
COPY examples/slotgate.toml /etc/slotgate/slotgate.toml
ENV SLOTGATE_CONFIG=/etc/slotgate/slotgate.toml
USER nobody
