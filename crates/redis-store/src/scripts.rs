//! The Lua scripts of the store, each one atomic on the server: appending under the next seq
//! (idempotent by token), requeueing a dead consumer's entries under new seqs, committing (ack
//! and trim), and taking a replica's pending turns. Kept together so that the invariants they
//! share (the counter only moves after a successful `XADD`; seqs never reused) read in one place.

/// Lua shared by the scripts that add entries: `add(stream, counter, field, value...)` adds the
/// entry under the next seq and only then moves the counter, so a failure writes nothing. When the
/// counter is behind the stream (it was lost or reset), the seq continues after the stream's last
/// ID instead of failing.
macro_rules! lua_add {
    () => {
        r"
local function add(stream, counter, ...)
  local seq = tonumber(redis.call('GET', counter) or '0') + 1
  local r = redis.pcall('XADD', stream, string.format('%d-0', seq), ...)
  if type(r) == 'table' and r.err then
    local info = redis.call('XINFO', 'STREAM', stream)
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then
        local top = tonumber(string.match(info[i + 1], '^(%d+)'))
        if top >= seq then seq = top + 1 end
      end
    end
    redis.call('XADD', stream, string.format('%d-0', seq), ...)
  end
  redis.call('SET', counter, string.format('%d', seq))
  return seq
end
"
    };
}

/// Adds the entry under the next seq, unless this append's token already got one. Also tells
/// whether the deployment's epoch key was missing (Redis lost its data since it was set). A
/// sample's images (n of them) are kept once per hash beside the stream: each blob key is set
/// when missing, and the image index (hash → the highest seq that references it) raised to this
/// seq; the entry carries the hashes (field `i`) so that a requeue raises them again. An image
/// without bytes (ARGV empty) whose blob is not kept refuses the append before anything is
/// written: {-1, i}.
/// KEYS: stream, counter, token, epoch, image index, blob key × n.
/// ARGV: payload, token lifetime (s), epoch value, n, hash × n, bytes × n.
/// Returns {seq, lost}.
pub(crate) const APPEND: &str = concat!(
    lua_add!(),
    r"
local done = redis.call('GET', KEYS[3])
if done then return {tonumber(done), 0} end
local n = tonumber(ARGV[4])
for i = 1, n do
  if ARGV[4 + n + i] == '' and redis.call('EXISTS', KEYS[5 + i]) == 0 then
    return {-1, i}
  end
end
local lost = 0
if redis.call('EXISTS', KEYS[4]) == 0 then
  lost = 1
  redis.call('SET', KEYS[4], ARGV[3])
end
local seq
if n > 0 then
  local hashes = {}
  for i = 1, n do hashes[i] = ARGV[4 + i] end
  seq = add(KEYS[1], KEYS[2], 's', ARGV[1], 'i', table.concat(hashes, ','))
  for i = 1, n do
    if ARGV[4 + n + i] ~= '' then
      redis.call('SET', KEYS[5 + i], ARGV[4 + n + i], 'NX')
    end
    redis.call('ZADD', KEYS[5], 'GT', seq, ARGV[4 + i])
  end
else
  seq = add(KEYS[1], KEYS[2], 's', ARGV[1])
end
redis.call('SET', KEYS[3], string.format('%d', seq), 'EX', ARGV[2])
return {seq, lost}
"
);

/// Hands the entries other consumers left pending longer than the idle time to whoever reads next:
/// each is added again under a new seq (above every cursor) and the old entry acknowledged and
/// deleted, in one step; its images' index entries are raised to the new seq. KEYS: stream,
/// counter, image index. ARGV: group, this consumer, idle (ms), how many pending entries to look
/// at. Returns how many were moved.
pub(crate) const REQUEUE: &str = concat!(
    lua_add!(),
    r"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', tonumber(ARGV[3]), '-', '+', tonumber(ARGV[4]))
local moved = 0
for _, e in ipairs(p) do
  local id, owner = e[1], e[2]
  if owner ~= ARGV[2] then
    local entry = redis.call('XRANGE', KEYS[1], id, id)
    if #entry > 0 then
      local fields = entry[1][2]
      local seq = add(KEYS[1], KEYS[2], unpack(fields))
      for f = 1, #fields, 2 do
        if fields[f] == 'i' then
          for hash in string.gmatch(fields[f + 1], '[^,]+') do
            redis.call('ZADD', KEYS[3], 'GT', seq, hash)
          end
        end
      end
      moved = moved + 1
    end
    redis.call('XACK', KEYS[1], ARGV[1], id)
    redis.call('XDEL', KEYS[1], id)
  end
end
return moved
"
);

/// Acknowledges this consumer's pending entries up to `through`, moves the commit point (never
/// back) and trims below both the retention point and the oldest entry still pending for anyone;
/// the images no kept entry references (their highest seq below the trim) are deleted.
/// KEYS: stream, counter, committed, image index. ARGV: through, group, retain, consumer, blob
/// key prefix (under the same hash tag).
/// Returns {1, last} when done, {0, last} when `through` is beyond the last seq.
pub(crate) const COMMIT: &str = r"
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local through = tonumber(ARGV[1])
if through > last then return {0, last} end
local upto = string.format('%d-0', through)
while true do
  local p = redis.call('XPENDING', KEYS[1], ARGV[2], '-', upto, 1000, ARGV[4])
  if #p == 0 then break end
  local ids = {}
  for i, e in ipairs(p) do ids[i] = e[1] end
  redis.call('XACK', KEYS[1], ARGV[2], unpack(ids))
end
local committed = tonumber(redis.call('GET', KEYS[3]) or '0')
if through > committed then
  redis.call('SET', KEYS[3], string.format('%d', through))
  committed = through
end
local floor = committed - tonumber(ARGV[3]) + 1
local summary = redis.call('XPENDING', KEYS[1], ARGV[2])
if summary[2] then
  local lowest = tonumber(string.match(summary[2], '^(%d+)'))
  if lowest < floor then floor = lowest end
end
if floor > 1 then
  redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d-0', floor))
  local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', floor - 1)
  for _, hash in ipairs(gone) do
    redis.call('DEL', ARGV[5] .. hash)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', floor - 1)
  end
end
return {1, last}
";

/// Returns and removes every pending turn of a replica. KEYS: the hash.
pub(crate) const TAKE_PENDING: &str = r"
local v = redis.call('HVALS', KEYS[1])
redis.call('DEL', KEYS[1])
return v
";
