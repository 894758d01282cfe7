// Preloaded (`node --require`) into the npm proxies the benchmarks start: supergateway and mcp-hub
// call `app.listen(port)`, which binds every interface; this makes any listen without a host
// bind 127.0.0.1 so a benchmark never exposes anything beyond loopback.
"use strict";
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const first = args[0];
  if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    if (typeof args[1] !== "string") args.splice(1, 0, "127.0.0.1");
  } else if (first && typeof first === "object" && !("path" in first) && !first.host) {
    args[0] = { ...first, host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
