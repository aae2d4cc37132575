# Rolter's image, for machines with a container engine; `make image` assembles the same image without one
# (deploy/image: the binary, the libraries it loads, user rolter 65532, the same entrypoint and ports).
FROM golang:1.26-bookworm AS build
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libzmq3-dev pkg-config >/dev/null
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=1 go build -ldflags "-X main.version=${VERSION}" -o /out/rolter ./cmd/rolter

FROM debian:bookworm-slim
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libzmq5 ca-certificates >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd -g 65532 rolter && useradd -u 65532 -g 65532 -d /var/lib/rolter -s /sbin/nologin rolter \
    && mkdir -p /etc/rolter /var/lib/rolter && chown 65532:65532 /var/lib/rolter
COPY --from=build /out/rolter /usr/local/bin/rolter
USER 65532:65532
WORKDIR /var/lib/rolter
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/rolter"]
CMD ["serve", "-config", "/etc/rolter/rolter.toml"]
