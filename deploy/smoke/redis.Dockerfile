# Redis from Debian's packages, for hosts that cannot pull the official redis image: same
# command line (redis-server ARGS), /data as the working directory, an unprivileged user.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends redis-server \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && install -d -o redis -g redis /data
COPY redis-entrypoint.sh /usr/local/bin/redis-entrypoint
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["redis-entrypoint"]
CMD ["redis-server"]
