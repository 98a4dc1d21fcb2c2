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

-- Each event carries what makes real events differ from one another, so that compressing the
-- producer's batches (lz4 by default) gains here what it would on real traffic, not more: an
-- anonymousId (a random UUID) and a 43-character random property. lz4 makes these events about 4
-- times smaller in the producer's batches; with only their ids differing, it made them 13 times
-- smaller. Everything after an event's messageId comes from a pool made once per thread, and a
-- request takes 20 consecutive entries from a random place in it: one draw per request.
local pool_size = 4096
local rests = {}
local function random_text(alphabet, n)
  local t = {}
  for i = 1, n do
    local c = math.random(1, #alphabet)
    t[i] = alphabet:sub(c, c)
  end
  return table.concat(t)
end
local function fill_pool()
  local hex = "0123456789abcdef"
  local token_chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
  math.randomseed(os.time() * 1000 + (thread_id or 0))
  for i = 1, pool_size do
    local h = random_text(hex, 32)
    local uuid = h:sub(1, 8) .. "-" .. h:sub(9, 12) .. "-4" .. h:sub(14, 16) .. "-a" .. h:sub(18, 20) .. "-" .. h:sub(21, 32)
    local n = i % 100
    rests[i] = '","type":"track","event":"Bench Event","userId":"user-' .. n .. '","anonymousId":"' .. uuid ..
      '","timestamp":"2024-01-01T00:00:00.000Z","properties":{"plan":"pro","n":' .. n ..
      ',"path":"/bench/page","token":"' .. random_text(token_chars, 43) .. '"}}'
  end
end

-- The body, built once per thread and cut where each request's own parts go: a request joins
-- the pieces around its id prefix and its pool entries in one table.concat, instead of twenty
-- string.formats or a gsub over the whole body, so wrk, which shares the machine with the server
-- and the broker, takes less of its CPU. Event i is four pieces from 2 + 4 * (i - 1): the id
-- prefix, the rest of its id, its pool entry, and what follows it (the next event's start, or the
-- body's end).
local pieces
local function build_pieces()
  fill_pool()
  local out = { '{"batch":[{"messageId":"' }
  for i = 1, events_per_request do
    out[#out + 1] = "" -- the id prefix
    out[#out + 1] = "-" .. i
    out[#out + 1] = "" -- the pool entry
    if i < events_per_request then out[#out + 1] = ',{"messageId":"' end
  end
  out[#out + 1] = '],"context":{"library":{"name":"wrk","version":"4"}},"sentAt":"2024-01-01T00:00:00.000Z"' ..
    body_key .. "}"
  return out
end

function request()
  counter = counter + 1
  pieces = pieces or build_pieces()
  local prefix = run_id .. "-" .. thread_id .. "-" .. counter
  local from = math.random(0, pool_size - 1)
  for e = 0, events_per_request - 1 do
    local at = 2 + 4 * e
    pieces[at] = prefix
    pieces[at + 2] = rests[(from + e) % pool_size + 1]
  end
  return wrk.format("POST", path, headers, table.concat(pieces))
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"non_2xx":%d,"socket_errors":%d,"timeouts":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"events_per_request":%d}\n',
    summary.requests, e.status, e.connect + e.read + e.write, e.timeout, summary.duration,
    latency:percentile(50), latency:percentile(99), events_per_request))
end
