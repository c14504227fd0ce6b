# Builds both binaries; compose.yaml and deploy/k8s/ run them.
FROM rust:1-bookworm AS build
WORKDIR /src

# Dependencies first, in a layer of their own: the manifests and stub
# targets, fetched and built once, so a change to the sources rebuilds only
# the workspace's crates.
COPY Cargo.toml Cargo.lock ./
COPY shared/Cargo.toml shared/
COPY audit/Cargo.toml audit/
COPY process/Cargo.toml process/
COPY planner/Cargo.toml planner/
COPY worker/Cargo.toml worker/
COPY testkit/Cargo.toml testkit/
COPY chaos/Cargo.toml chaos/
COPY bench/Cargo.toml bench/
RUN for c in shared audit process testkit planner worker; do mkdir -p $c/src && echo '' > $c/src/lib.rs; done \
 && for c in planner worker chaos bench; do mkdir -p $c/src && echo 'fn main() {}' > $c/src/main.rs; done \
 && cargo fetch --locked \
 && cargo build --release --locked -p planner -p worker \
 && rm -rf shared/src audit/src process/src testkit/src planner/src worker/src chaos/src bench/src

# The sources. Their files are touched so they are newer than the stubs'
# build, whatever their timestamps in the build context.
COPY . .
RUN find shared audit process planner worker -name '*.rs' -exec touch {} + \
 && cargo build --release --locked -p planner -p worker

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates tzdata && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/planner /src/target/release/worker /usr/local/bin/
COPY examples/slotgate.toml /etc/slotgate/slotgate.toml
ENV SLOTGATE_CONFIG=/etc/slotgate/slotgate.toml
# 65534 is nobody; numeric, so Kubernetes' runAsNonRoot can verify it.
USER 65534:65534
