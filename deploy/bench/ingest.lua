-- wrk script for deploy/bench/ingest.sh: POSTs 20 track events per request, each with a unique
-- messageId, from a browser Origin. To /v1/batch (the default) as the server libraries do:
-- application/json, authenticated with HTTP Basic (the write key as user name). To /v1/b as the
-- browser and mobile libraries do: text/plain, the write key in the body.
-- Environment: BENCH_WRITE_KEY (required), BENCH_RUN_ID (makes ids unique across runs),
-- BENCH_PATH (/v1/batch or /v1/b), BENCH_ORIGIN (the Origin header).

local events_per_request = 20
local write_key = os.getenv("BENCH_WRITE_KEY") or error("BENCH_WRITE_KEY is not set")
local run_id = os.getenv("BENCH_RUN_ID") or tostring(os.time())
local path = os.getenv("BENCH_PATH") or "/v1/batch"
local origin = os.getenv("BENCH_ORIGIN") or "http://bench.example"
local key_in_body = path == "/v1/b"
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
local headers
local body_key = ""
if key_in_body then
  headers = { ["Content-Type"] = "text/plain", ["Origin"] = origin }
  body_key = ',"writeKey":"' .. write_key .. '"'
else
  headers = {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Basic " .. base64(write_key .. ":"),
    ["Origin"] = origin,
  }
end

-- The body, built once per thread and cut where each request's unique prefix goes: a request
-- joins the pieces around its prefix in one table.concat instead of twenty string.formats or a
-- gsub over the whole body, so wrk, which shares the machine with the server and the broker,
-- takes less of its CPU.
local pieces
local function build_pieces()
  local parts = {}
  for i = 1, events_per_request do
    parts[i] = string.format(
      '{"type":"track","event":"Bench Event","userId":"user-%d","messageId":"@ID@-%d",' ..
      '"timestamp":"2024-01-01T00:00:00.000Z","properties":{"plan":"pro","n":%d,"path":"/bench/page"}}',
      i, i, i)
  end
  local template = '{"batch":[' .. table.concat(parts, ",") ..
    '],"context":{"library":{"name":"wrk","version":"4"}},"sentAt":"2024-01-01T00:00:00.000Z"' .. body_key .. '}'
  -- Odd slots hold the text between ids; even slots are set to each request's prefix.
  local out, from = {}, 1
  while true do
    local at = template:find("@ID@", from, true)
    if not at then break end
    out[#out + 1] = template:sub(from, at - 1)
    out[#out + 1] = ""
    from = at + 4
  end
  out[#out + 1] = template:sub(from)
  return out
end

function request()
  counter = counter + 1
  pieces = pieces or build_pieces()
  local prefix = run_id .. "-" .. thread_id .. "-" .. counter
  for i = 2, #pieces, 2 do pieces[i] = prefix end
  return wrk.format("POST", path, headers, table.concat(pieces))
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"non_2xx":%d,"socket_errors":%d,"timeouts":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"events_per_request":%d}\n',
    summary.requests, e.status, e.connect + e.read + e.write, e.timeout, summary.duration,
    latency:percentile(50), latency:percentile(99), events_per_request))
end
