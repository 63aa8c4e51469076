-- wrk script for bench/wrk_load.py: replays a file of raw HTTP requests once, in order, over
-- wrk's connections (each sends its next request when its answer is in). It prints "start"
-- as the first request goes and "end" when the last answer is in: wrk's own run lasts its
-- -d, so wrk_load.py times the run between the two and then stops wrk (SIGINT).
-- The file: for each request, its length in bytes on a line, then its bytes.
-- Usage: wrk -t1 -cN -d600s -s wrk_replay.lua URL -- REQUESTS_FILE

local requests, total, reserved, sent, answered = {}, 0, 0, 0, 0

function init(args)
  local file = assert(io.open(args[1], "rb"))
  while true do
    local line = file:read("*l")
    if not line then break end
    requests[#requests + 1] = file:read(tonumber(line))
  end
  file:close()
  total = #requests
end

-- Called before each request a connection sends: once every request has its connection,
-- the others wait (an hour: past the end of the run) instead of sending a second copy.
function delay()
  if reserved >= total then return 3600000 end
  reserved = reserved + 1
  return 0
end

function request()
  -- wrk calls this once before the run to check the script: no request is reserved then.
  if sent >= reserved then return requests[1] end
  sent = sent + 1
  if sent == 1 then io.write("start\n"); io.flush() end
  return requests[sent]
end

function response(status, headers, body)
  answered = answered + 1
  if answered == total then io.write("end\n"); io.flush() end
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    '{"wrk": 1, "requests": %d, "seconds": %.6f, "p50_us": %d, "p99_us": %d, "errors": %d}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    errors.connect + errors.read + errors.write + errors.status + errors.timeout))
end
