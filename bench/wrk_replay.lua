-- wrk script for bench/wrk_load.py: replays a file of raw HTTP requests once, in order, over
-- wrk's connections (each sends its next request when its answer is in). It prints "start"
-- as the first request goes and "end" when the last answer is in: wrk's own run lasts its
-- -d, so wrk_load.py times the run between the two and then stops wrk (SIGINT).
-- The file: for each request, its length in bytes on a line, then its bytes.
-- Usage: wrk -t1 -cN -dSECONDSs -s wrk_replay.lua URL -- REQUESTS_FILE

local requests, reserved, sent, checked = {}, 0, 0, false
total, answered, ok = 0, 0, 0 -- globals: done() reads them through thread:get

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

-- Called before each request a connection sends after an answer: once every request has its
-- connection, the others wait (an hour: past the end of the run) instead of sending a second
-- copy. (A connection that failed mid-request reconnects and sends without asking.)
function delay()
  if reserved >= total then return 3600000 end
  reserved = reserved + 1
  return 0
end

function request()
  if not checked then -- wrk calls this once before the run to check the script
    checked = true
    return requests[1]
  end
  sent = sent + 1
  if sent > reserved then reserved = sent end -- a reconnect, which skipped delay()
  if sent == 1 then io.write("start\n"); io.flush() end
  return requests[math.min(sent, total)]
end

function response(status, headers, body)
  answered = answered + 1
  if status >= 200 and status < 300 then ok = ok + 1 end
  if answered == total then io.write("end\n"); io.flush() end
end

local threads = {}

function setup(thread)
  threads[#threads + 1] = thread
end

-- errors: requests not answered 2xx (a connection the server closed while it idled at the
-- end of the run is no error; one closed mid-request loses that request, counted here).
function done(summary, latency, requests)
  local wanted, answers, good = 0, 0, 0
  for _, thread in ipairs(threads) do
    wanted = wanted + thread:get("total")
    answers, good = answers + thread:get("answered"), good + thread:get("ok")
  end
  io.write(string.format(
    '{"wrk": 1, "answers": %d, "seconds": %.6f, "p50_us": %d, "p99_us": %d, "errors": %d}\n',
    answers, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    math.max(0, wanted - good)))
end
