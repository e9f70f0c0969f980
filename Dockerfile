# wasmstate in a container: one static-ish binary with the first-party guests
# embedded, on a slim runtime image.
#
#   docker build -t wasmstate .
#   docker run -p 6061:6061 -v wasmstate-data:/var/lib/wasmstate \
#     -v $PWD/wasmstate.toml:/etc/wasmstate/wasmstate.toml:ro wasmstate
#
# In a container the server listens on 0.0.0.0, so the config must define
# [[users]] or [[tokens]] (or [tls] client_ca): wasmstate refuses to serve
# state to the network without authentication.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# rust-toolchain.toml asks for wasm32-wasip2; the build script also adds it
# if missing. Guests are compiled to wasm by host/build.rs.
COPY . .
RUN rustup target add wasm32-wasip2 \
 && cargo build --release --locked --bin wasmstate \
      --config 'profile.release.debug=false' \
      --config 'profile.release.incremental=false' \
 && strip target/release/wasmstate

FROM debian:bookworm-slim
# libssl3 and zlib for libgit2 (the git capability); CA roots for https
# remotes (S3, git over https).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/wasmstate --create-home wasmstate
COPY --from=build /src/target/release/wasmstate /usr/local/bin/wasmstate
USER 10001
VOLUME /var/lib/wasmstate
EXPOSE 6061
ENV WASMSTATE_DATA_DIR=/var/lib/wasmstate \
    WASMSTATE_LISTEN=0.0.0.0:6061 \
    WASMSTATE_CONFIG=/etc/wasmstate/wasmstate.toml
# SIGTERM lets in-flight requests finish.
STOPSIGNAL SIGTERM
ENTRYPOINT ["wasmstate"]
CMD ["serve"]
