# Datum from source, run as an unprivileged user: docs/operating.md says how
# to build and run it.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# Only the host binary: the examples, tests and benches are not built.
RUN cargo build --release --locked -p datum --bin datum \
 && install -m 0755 target/release/datum /datum

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/datum --create-home datum
COPY --from=build /datum /usr/local/bin/datum
USER 10001:10001
WORKDIR /var/lib/datum
# The state file (`state = "/var/lib/datum/state.redb"`) and module versions.
VOLUME ["/var/lib/datum"]
ENTRYPOINT ["/usr/local/bin/datum"]
CMD ["run", "/etc/datum/datum.toml"]
