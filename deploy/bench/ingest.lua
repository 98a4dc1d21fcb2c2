-- wrk script for deploy/bench/ingest.sh: POSTs /v1/batch with 20 track events per request, each
-- with a unique messageId, authenticated with HTTP Basic (the write key as user name).
-- Environment: BENCH_WRITE_KEY (required), BENCH_RUN_ID (makes ids unique across runs).

local events_per_request = 20
local write_key = os.getenv("BENCH_WRITE_KEY") or error("BENCH_WRITE_KEY is not set")
local run_id = os.getenv("BENCH_RUN_ID") or tostring(os.time())
local threads = {}
local next_thread = 1

-- Base64 of "KEY:" for the Authorization header.
local function base64(s)
  local chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  return ((s:gsub(".", function(x)
    local r, b = "", x:byte()
    for i = 8, 1, -1 do r = r .. (b % 2 ^ i - b % 2 ^ (i - 1) > 0 and "1" or "0") end
    return r
  end) .. "0000"):gsub("%d%d%d?%d?%d?%d?", function(x)
    if #x < 6 then return "" end
    local c = 0
    for i = 1, 6 do c = c + (x:sub(i, i) == "1" and 2 ^ (6 - i) or 0) end
    return chars:sub(c + 1, c + 1)
  end) .. ({ "", "==", "=" })[#s % 3 + 1])
end

function setup(thread)
  thread:set("thread_id", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

local counter = 0
local headers = {
  ["Content-Type"] = "application/json",
  ["Authorization"] = "Basic " .. base64(write_key .. ":"),
}

function request()
  counter = counter + 1
  local parts = {}
  for i = 1, events_per_request do
    parts[i] = string.format(
      '{"type":"track","event":"Bench Event","userId":"user-%d","messageId":"%s-%d-%d-%d",' ..
      '"timestamp":"2024-01-01T00:00:00.000Z","properties":{"plan":"pro","n":%d,"path":"/bench/page"}}',
      counter % 1000, run_id, thread_id, counter, i, i)
  end
  local body = '{"batch":[' .. table.concat(parts, ",") ..
    '],"context":{"library":{"name":"wrk","version":"4"}},"sentAt":"2024-01-01T00:00:00.000Z"}'
  return wrk.format("POST", "/v1/batch", headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"non_2xx":%d,"socket_errors":%d,"timeouts":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"events_per_request":%d}\n',
    summary.requests, e.status, e.connect + e.read + e.write, e.timeout, summary.duration,
    latency:percentile(50), latency:percentile(99), events_per_request))
end
