# SPDX-License-Identifier: MIT
"""``python -m cudamem memviz``: draw a memory snapshot.

Reads the JSON that ``cudamem.dump_snapshot`` (or ``err.dump`` of an
out-of-memory error) writes and makes either one self-contained HTML page
(every picture is inline SVG drawn here, with a little inline script for
hover details; nothing is fetched from the network) or a PNG timeline
with matplotlib.

The page holds: the timeline of live bytes per kind of memory, device and
stream, rebuilt from the history's events; the pool manager's segments as
a fragmentation map (used, free and pending blocks to scale); the largest
live allocations with the stacks that made them; and, for an
out-of-memory snapshot, what the error reported.  The series drawn are
also embedded as JSON (``<script id="memviz-data">``) for tools.
"""

import html
import json
import math
import time

__all__ = ["load", "series", "write_html", "write_png"]

MAX_POINTS = 4000   # per series; past it, the peaks of time buckets


def load(path):
    """The snapshot dict in a JSON file; ValueError if it is not one."""
    with open(path, encoding="utf-8") as f:
        snap = json.load(f)
    if (not isinstance(snap, dict) or "history" not in snap
            or "live" not in snap):
        raise ValueError("not a cudamem memory snapshot (no 'history' and "
                         "'live' keys)")
    return snap


def stream_names(snap):
    """A name for each stream handle of the snapshot: 0 is the default
    stream, 1 and 2 the legacy and per-thread default streams, the others
    'stream 1', 'stream 2', ... in the order they first appear (the
    history's events, then the live allocations).  The raw handles are
    the process's addresses, shown only in the tooltips."""
    names = {0: "default stream", 1: "legacy default stream",
             2: "per-thread default stream"}
    n = 0
    for h in ([e.get("stream") or 0 for e in snap["history"]["entries"]]
              + [b.get("stream") or 0 for b in snap["live"]]):
        if h not in names:
            n += 1
            names[h] = "stream %d" % n
    return names


def _series_key(kind, device, stream, multi_device, names):
    name = kind
    if stream:
        name += " " + names[stream]
    if multi_device:
        name += " (device %d)" % device
    return name


def _decimate(points):
    """At most about MAX_POINTS points: past it, the lowest and the
    highest point of each time bucket, in time order, so that the drawn
    line keeps both the peaks and the troughs."""
    if len(points) <= MAX_POINTS:
        return points
    t0, t1 = points[0][0], points[-1][0]
    width = (t1 - t0) / (MAX_POINTS // 2 - 1) or 1.0
    keep = [0]
    bucket = lo = hi = None
    for i in range(1, len(points) - 1):
        b = int((points[i][0] - t0) / width)
        if b != bucket:
            if bucket is not None:
                keep.extend(sorted({lo, hi}))
            bucket, lo, hi = b, i, i
        elif points[i][1] < points[lo][1]:
            lo = i
        elif points[i][1] > points[hi][1]:
            hi = i
    if bucket is not None:
        keep.extend(sorted({lo, hi}))
    keep.append(len(points) - 1)
    return [points[i] for i in keep]


def series(snap):
    """The live bytes over time of each kind/device/stream, rebuilt from
    the history: {name: [(seconds since the first event, bytes), ...]},
    plus 'total'.  Each series starts at what was already live when the
    record begins (what is live at the snapshot less the net of the
    events recorded)."""
    entries = [e for e in snap["history"]["entries"]
               if e["action"] in ("alloc", "free")]
    devices = {e["device"] for e in entries}
    devices |= {b["device"] for b in snap["live"]}
    multi = len(devices) > 1
    names_of = stream_names(snap)

    def key(kind, device, stream):
        return _series_key(kind, device, stream if kind == "device" else 0,
                           multi, names_of)

    final = {}
    for b in snap["live"]:
        k = key(b["kind"], b["device"], b.get("stream") or 0)
        final[k] = final.get(k, 0) + b["size"]
    net = {}
    for e in entries:
        k = key(e["kind"], e["device"], e["stream"])
        d = e["size"] if e["action"] == "alloc" else -e["size"]
        net[k] = net.get(k, 0) + d
    names = sorted(set(final) | set(net))
    t_first = entries[0]["time"] if entries else snap.get("time", 0.0)
    t_end = snap.get("time", t_first)
    level = {k: max(final.get(k, 0) - net.get(k, 0), 0) for k in names}
    out = {k: [(0.0, level[k])] for k in names}
    total = [(0.0, sum(level.values()))]
    tot = total[0][1]
    for e in entries:
        k = key(e["kind"], e["device"], e["stream"])
        d = e["size"] if e["action"] == "alloc" else -e["size"]
        level[k] = max(level[k] + d, 0)
        tot = max(tot + d, 0)
        t = e["time"] - t_first
        out[k].append((t, level[k]))
        total.append((t, tot))
    end = max(t_end - t_first, total[-1][0])
    for k in names:
        out[k].append((end, out[k][-1][1]))
    total.append((end, total[-1][1]))
    out = {k: _decimate(v) for k, v in out.items()}
    out["total"] = _decimate(total)
    return out


# ---------------------------------------------------------------------------
# HTML

# The series' colours; red is kept for the out-of-memory mark (OOM_COLOR)
# alone.
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
OOM_COLOR = "#dd0000"
# The pool's blocks: a used block is blue, never the OOM mark's red.
BLOCK_COLORS = {"used": "#1f77b4", "free": "#2ca02c", "pending": "#ff7f0e"}
MAPPED_COLOR = "#555555"

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right;
border-bottom:1px solid #ddd}th{background:#f4f4f4}
td.l,th.l{text-align:left}.sim{color:#b00;font-weight:bold}
svg text{font:11px sans-serif}
.legend>span{display:inline-block;white-space:nowrap;margin-right:14px}
.sw{display:inline-block;width:12px;height:12px;margin-right:4px;
vertical-align:middle}.hint{color:#666;font-size:12px}
#tip{position:fixed;background:#ffe;border:1px solid #999;padding:3px 6px;
pointer-events:none;display:none;font:12px/1.35 monospace;white-space:pre;
max-width:70vw;overflow:hidden;z-index:2}
#detail{position:fixed;right:12px;bottom:12px;max-width:min(900px,90vw);
max-height:45vh;overflow:auto;background:#fff;border:1px solid #888;
box-shadow:0 2px 8px rgba(0,0,0,.25);padding:6px 10px;display:none;
z-index:3}#detail pre{font:12px/1.35 monospace;margin:0}
#detail button{float:right;margin-left:8px}
rect.block.sel,rect.oom.sel{stroke:#000;stroke-width:2}
pre{margin:2px 0;font-size:12px}details{margin:0}
"""

# The page's script: one listener for the whole page (not one per
# element, which a page of many blocks would make slow), a tooltip kept
# inside the window, the live bytes of every series under the cursor on
# the timeline, and on a click the chosen block's or event's whole
# record, stack included, in a panel that stays.
_JS = """
(function(){
var data=JSON.parse(document.getElementById('memviz-data').textContent);
var tip=document.getElementById('tip'),
detail=document.getElementById('detail'),
detailText=document.getElementById('detail-text'),
tl=document.getElementById('timeline'),cur=document.getElementById('cursor');
var U=['B','KiB','MiB','GiB','TiB','PiB'];
function fmt(n){var i=0;while(Math.abs(n)>=1024&&i<5){n/=1024;i++;}
return i?n.toFixed(1)+' '+U[i]:Math.floor(n)+' B';}
function record(i,full){var a=data.allocs[i],t=a.head.join('\\n');
var st=a.stack>=0?data.stacks[a.stack]:null;
if(!st)return t+'\\nno stack recorded';
var fr=full?st:st.slice(0,8);t+='\\n'+a.at+':\\n  '+fr.join('\\n  ');
if(fr.length<st.length)t+='\\n  ... '+(st.length-fr.length)+
' more frames (click)';return t;}
function textOf(el,full){var i=el.getAttribute('data-alloc');
return i===null?el.getAttribute('data-tip'):record(+i,full);}
function show(text,ev){tip.textContent=text;tip.style.display='block';
var x=ev.clientX+14,y=ev.clientY+14,w=tip.offsetWidth,h=tip.offsetHeight;
if(x+w>innerWidth-4)x=Math.max(4,ev.clientX-14-w);
if(y+h>innerHeight-4)y=Math.max(4,ev.clientY-14-h);
tip.style.left=x+'px';tip.style.top=y+'px';}
function hide(){tip.style.display='none';if(cur)cur.style.display='none';}
function at(p,t){if(!p.length||t<p[0][0])return 0;var lo=0,hi=p.length-1;
while(lo<hi){var m=(lo+hi+1)>>1;if(p[m][0]<=t)lo=m;else hi=m-1;}
return p[lo][1];}
function readout(ev){var r=tl.getBoundingClientRect();if(!r.width)return null;
var x=(ev.clientX-r.left)*tl.viewBox.baseVal.width/r.width,
L=+tl.dataset.left,W=+tl.dataset.width,T=+tl.dataset.tmax;
if(x<L||x>L+W)return null;var t=(x-L)/W*T,
lines=['t = '+t.toPrecision(4)+' s'];
data.order.forEach(function(k){lines.push(k+': '+fmt(at(data.series[k],t)));});
cur.setAttribute('x1',x);cur.setAttribute('x2',x);cur.style.display='';
return lines.join('\\n');}
function target(ev){return ev.target&&ev.target.closest?
ev.target.closest('[data-tip]'):null;}
document.addEventListener('mousemove',function(ev){var el=target(ev);
if(el){if(cur)cur.style.display='none';show(textOf(el,false),ev);return;}
if(tl&&tl.contains(ev.target)){var t=readout(ev);if(t){show(t,ev);return;}}
hide();});
document.documentElement.addEventListener('mouseleave',hide);
document.addEventListener('click',function(ev){var el=target(ev);if(!el)return;
var old=document.querySelector('.sel');if(old)old.classList.remove('sel');
el.classList.add('sel');detailText.textContent=textOf(el,true);
detail.style.display='block';});
document.getElementById('detail-close').addEventListener('click',function(){
detail.style.display='none';var old=document.querySelector('.sel');
if(old)old.classList.remove('sel');});
})();
"""


def _fmt_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return ("%d %s" % (n, unit)) if unit == "B" else (
                "%.1f %s" % (n, unit))
        n /= 1024
    return "%d B" % n


def _e(s):
    return html.escape(str(s), quote=True)


def _stream_name(stream, names):
    """The stream's name with its raw handle, for tooltips."""
    stream = stream or 0
    name = names.get(stream, "stream")
    return name if stream == 0 else "%s (handle 0x%x)" % (name, stream)


def _nice_ticks(top, count=4):
    """Round tick values from 0 covering top: a step of 1, 2 or 5 times a
    power of ten (of the unit, for bytes: see _byte_ticks), at most about
    count + 1 ticks; the last tick is at or above top."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _byte_ticks(top, count=4):
    """Round byte values from 0 covering top: round in the largest unit
    (B, KiB, MiB, GiB, TiB) top reaches, and their labels."""
    unit, name = 1, "B"
    for u, nm in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"),
                  (1 << 10, "KiB")):
        if top >= u:
            unit, name = u, nm
            break
    vals = _nice_ticks(top / unit, count)
    return ([v * unit for v in vals],
            ["%g %s" % (v, name) if v else "0" for v in vals])


class _Records:
    """What the page's script shows for a block or an event: its lines of
    text and its stack, each stack stored once (many allocations share
    one), referred to by index from the element's data-alloc."""

    def __init__(self):
        self.allocs = []
        self.stacks = []
        self._ids = {}

    def _stack(self, stack):
        if not stack:
            return -1
        key = tuple((f["filename"], f["line"], f["function"])
                    for f in stack)
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self.stacks)
            self.stacks.append(["%s:%d in %s" % f for f in key])
        return i

    def add(self, head, stack, at):
        self.allocs.append({"head": head, "stack": self._stack(stack),
                            "at": at})
        return len(self.allocs) - 1


def _t_first(snap):
    """The time the timeline starts at: the first allocation or free
    recorded (the snapshot's time without one)."""
    for e in snap["history"]["entries"]:
        if e["action"] in ("alloc", "free"):
            return e["time"]
    return snap.get("time", 0.0)


def _timeline_svg(ser, ooms, records, snames):
    """The timeline and its legend; ooms: [(seconds, entry)]; snames: the
    streams' names (stream_names)."""
    w, h, left, bottom, top, right = 900, 320, 70, 30, 16, 12
    names = [k for k in ser if k != "total"] + ["total"]
    # Each named stream's raw handle, for the legend's tooltips.
    handles = {nm: sh for sh, nm in snames.items() if sh not in (0, 1, 2)}
    t_max = max((pts[-1][0] for pts in ser.values() if pts), default=1.0)
    t_max = max([t_max] + [t for t, _ in ooms]) or 1.0
    y_max = max((v for pts in ser.values() for _, v in pts), default=1)
    y_max = y_max or 1
    # Round ticks.  The byte axis ends at its last one; the time axis
    # ends with the data, so that every series spans the timeline, and
    # shows the round times within it.
    t_ticks = [t for t in _nice_ticks(t_max) if t <= t_max * (1 + 1e-9)]
    y_ticks, y_labels = _byte_ticks(y_max)
    y_max = y_ticks[-1]
    pw, ph = w - left - right, h - top - bottom

    def x(t):
        return left + pw * t / t_max

    def y(v):
        return top + ph - ph * v / y_max

    parts = ['<svg id="timeline" xmlns="http://www.w3.org/2000/svg" '
             'width="%d" height="%d" viewBox="0 0 %d %d" data-left="%d" '
             'data-width="%d" data-tmax="%r">'
             % (w, h, w, h, left, pw, t_max)]
    parts.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#fafafa" '
                 'stroke="#ccc"/>' % (left, top, pw, ph))
    for v, label in zip(y_ticks, y_labels, strict=True):
        parts.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" '
                     'stroke="#eee"/>' % (left, left + pw, y(v), y(v)))
        parts.append('<text class="ytick" x="%d" y="%.1f" '
                     'text-anchor="end">%s</text>'
                     % (left - 4, y(v) + 4, _e(label)))
    for i, t in enumerate(t_ticks):
        # The last label ends at the axis's end, inside the picture.
        parts.append('<text class="xtick" x="%.1f" y="%d" text-anchor="%s">'
                     '%g s</text>'
                     % (x(t), h - 10,
                        "end" if i == len(t_ticks) - 1 else "middle",
                        round(t, 9)))
    legend = []
    for i, k in enumerate(names):
        pts = ser[k]
        color = "#000" if k == "total" else _COLORS[i % len(_COLORS)]
        d = []
        prev = None
        for t, v in pts:
            if prev is not None:
                d.append("L%.1f,%.1f" % (x(t), y(prev)))
            d.append(("M" if prev is None else "L")
                     + "%.1f,%.1f" % (x(t), y(v)))
            prev = v
        peak = max(v for _, v in pts)
        parts.append(
            '<path class="series" data-series="%s" d="%s" fill="none" '
            'stroke="%s" stroke-width="%s"/>'
            % (_e(k), " ".join(d), color, "2" if k == "total" else "1.5"))
        handle = next((h for nm, h in handles.items()
                       if k == "device " + nm
                       or k.startswith("device " + nm + " (")), None)
        title = (' title="stream handle 0x%x"' % handle
                 if handle is not None else "")
        legend.append('<span%s><i class="sw" style="background:%s"></i>%s '
                      '<span class="hint">(peak %s)</span></span>'
                      % (title, color, _e(k), _e(_fmt_bytes(peak))))
    for t, e in ooms:
        head = ["out of memory: %s of %s memory asked for"
                % (_fmt_bytes(e["size"]), e["kind"]),
                "device %d, %s, %s manager, at t = %.4g s"
                % (e["device"], _stream_name(e["stream"], snames),
                   e["manager"], t)]
        idx = records.add(head, e.get("stack"), "failed at")
        # Two pixels wide on whole pixels: a crisp line, not a blur.
        parts.append('<line x1="%d" x2="%d" y1="%d" y2="%d" '
                     'stroke="%s" stroke-width="2" '
                     'stroke-dasharray="4 3"/>'
                     % (round(x(t)), round(x(t)), top, top + ph, OOM_COLOR))
        parts.append('<text x="%.1f" y="%d" text-anchor="end" fill="%s">'
                     'OOM</text>' % (x(t) - 2, top - 4, OOM_COLOR))
        # A band wider than the line, so that it is easy to point at.
        parts.append('<rect class="oom" x="%.1f" y="%d" width="9" '
                     'height="%d" fill="transparent" pointer-events="all" '
                     'data-tip="%s" data-alloc="%d"/>'
                     % (x(t) - 4.5, top, ph, _e("\n".join(head)), idx))
    if ooms:
        legend.append('<span><i class="sw" style="background:%s"></i>'
                      'out of memory</span>' % OOM_COLOR)
    parts.append('<line id="cursor" x1="0" x2="0" y1="%d" y2="%d" '
                 'stroke="#888" stroke-width="1" style="display:none"/>'
                 % (top, top + ph))
    parts.append("</svg>")
    return "".join(parts), '<div class="legend">%s</div>' % "".join(legend)


def _segments_svg(dev, live, records, snames):
    """The pool's segments of one device, each block to scale; a used
    block's record is its live allocation (size asked for, stream,
    stack)."""
    segs = dev.get("segments") or []
    if not segs:
        return ""
    w, row, left = 900, 22, 170
    arenas = [s for s in segs if "mapped" in s]
    h = row * len(segs) + 10
    spans = [_span(s) for s in segs]
    biggest = max(spans)
    colors = BLOCK_COLORS
    parts = ['<svg class="segments" data-device="%d" '
             'xmlns="http://www.w3.org/2000/svg" width="%d" height="%d">'
             % (dev["device"], w, h)]
    for i, s in enumerate(segs):
        y = 5 + i * row
        scale = (w - left - 10) / biggest
        end = s["base"] + spans[i]
        if "mapped" in s:
            mapped = sum(hi - lo for lo, hi in s["mapped"])
            in_use = sum(n for _, n, st in s["blocks"] if st != "free")
            tip = ("arena 0x%x: %s mapped, %s in blocks in use, largest "
                   "free mapped extent %s; %s of addresses reserved, the "
                   "first %s drawn"
                   % (s["base"], _fmt_bytes(mapped), _fmt_bytes(in_use),
                      _fmt_bytes(_largest_free_mapped(s)),
                      _fmt_bytes(s["size"]), _fmt_bytes(spans[i])))
            parts.append('<text x="4" y="%d" data-tip="%s">arena, %s mapped'
                         '</text>' % (y + 14, _e(tip),
                                      _e(_fmt_bytes(mapped))))
            for lo, hi in s["mapped"]:
                if lo >= end:
                    continue
                parts.append(
                    '<rect class="mapped" x="%.1f" y="%d" width="%.1f" '
                    'height="3" fill="%s"/>'
                    % (left + (lo - s["base"]) * scale, y + row - 6,
                       max((min(hi, end) - lo) * scale, 1.0), MAPPED_COLOR))
        else:
            parts.append('<text x="4" y="%d">0x%x %s</text>'
                         % (y + 14, s["base"], _e(_fmt_bytes(s["size"]))))
        for r in _block_rects(s["blocks"], s["base"], end, left, scale):
            parts.append(_block_rect(r, dev, live, records, snames, y,
                                     row, colors))
    parts.append("</svg>")
    legend = "".join('<span><i class="sw" style="background:%s"></i>%s'
                     '</span>' % (c, s) for s, c in colors.items())
    if arenas:
        legend += ('<span><i class="sw" style="background:%s"></i>memory '
                   'mapped (an arena of virtual memory: the strip under '
                   'its blocks; drawn up to its last mapped page or block '
                   'in use)</span>' % MAPPED_COLOR)
    return "".join(parts) + '<div class="legend">%s</div>' % legend


def _block_rects(blocks, base, end, left, scale):
    """The rectangles of a segment's blocks up to end, in address order:
    (x, width, [(addr, size, state), ...]).  None is narrower than a
    pixel and none overlaps the next, so that the mouse finds the block
    it points at: a block that would end inside the pixels already drawn
    joins the rectangle before it (drawn as one, a cluster), one that
    would be narrower than a pixel starts at the end of the last and is a
    pixel wide."""
    rects = []
    cursor = None
    for addr, size, state in blocks:
        if addr >= end:
            continue
        size = min(size, end - addr)
        x0 = left + (addr - base) * scale
        x1 = left + (addr + size - base) * scale
        if rects and x1 <= cursor + 1e-6:
            rects[-1][2].append((addr, size, state))
            continue
        x = x0 if cursor is None or x0 >= cursor else cursor
        w = max(x1 - x, 1.0)
        rects.append([x, w, [(addr, size, state)]])
        cursor = x + w
    return rects


def _block_rect(r, dev, live, records, snames, y, row, colors):
    """One rectangle of _block_rects: a block, with its live allocation's
    record when it is used; or a cluster of blocks too small to draw one
    by one, coloured by the state holding most of its bytes, with the
    record of its largest used block."""
    x, w, members = r
    addr, size, state = members[0]
    extra = ""
    if len(members) == 1:
        tip = "block 0x%x: %s, %s" % (addr, _fmt_bytes(size), state)
        used = [members[0]] if state == "used" else []
        cls = state
    else:
        by = {}
        for _, n, st in members:
            c, b = by.get(st, (0, 0))
            by[st] = (c + 1, b + n)
        last = members[-1]
        tip = "%d blocks at 0x%x-0x%x, too small to draw one by one: %s" % (
            len(members), addr, last[0] + last[1], ", ".join(
                "%s %s in %d" % (st, _fmt_bytes(b), c)
                for st, (c, b) in sorted(by.items())))
        state = max(by, key=lambda st: by[st][1])
        used = sorted((m for m in members if m[2] == "used"),
                      key=lambda m: -m[1])
        cls = "cluster " + state + (" used" if used and state != "used"
                                    else "")
        extra = ' data-n="%d"' % len(members)
    ref = ""
    for a, n, _ in used:
        b = live.get((dev["device"], a))
        if b is None:
            continue
        head = [tip]
        if len(members) > 1:
            head.append("its largest block in use: 0x%x, %s"
                        % (a, _fmt_bytes(n)))
        head.append("allocation: %s of %s memory, device %d, %s"
                    % (_fmt_bytes(b["size"]), b["kind"], b["device"],
                       _stream_name(b.get("stream"), snames)))
        ref = ' data-alloc="%d"' % records.add(head, b.get("stack"),
                                               "allocated at")
        break
    return ('<rect class="block %s" x="%.1f" y="%d" width="%.1f" '
            'height="%d" fill="%s" stroke="#fff" stroke-width="0.5" '
            'data-tip="%s"%s%s/>'
            % (cls, round(x, 1), y, round(x + w, 1) - round(x, 1), row - 6,
               colors.get(state, "#999"), _e(tip),
               extra, ref))


def _span(seg):
    """The bytes of a segment drawn: all of a cuMemAlloc'd one; of an
    arena of virtual memory (its reservation is as large as the device),
    up to its last mapped page or block in use, at least one page."""
    if "mapped" not in seg:
        return seg["size"]
    end = seg["base"] + seg.get("page_size", 1)
    for _, hi in seg["mapped"]:
        end = max(end, hi)
    for addr, size, state in seg["blocks"]:
        if state != "free":
            end = max(end, addr + size)
    return min(end - seg["base"], seg["size"])


def _largest_free_mapped(seg):
    """The longest run of an arena's bytes that are free and mapped."""
    best = 0
    runs = seg["mapped"]
    for addr, size, state in seg["blocks"]:
        if state != "free":
            continue
        for lo, hi in runs:
            a, b = max(lo, addr), min(hi, addr + size)
            if b > a:
                best = max(best, b - a)
    return best


def _stack_html(stack):
    if not stack:
        return "<i>no stack recorded</i>"
    lines = "\n".join("%s:%d in %s" % (f["filename"], f["line"],
                                        f["function"]) for f in stack)
    return "<details><summary>%s:%d in %s</summary><pre>%s</pre>" \
           "</details>" % (_e(stack[0]["filename"]), stack[0]["line"],
                           _e(stack[0]["function"]), _e(lines))


def render_html(snap):
    """The page for a snapshot, as a str."""
    ser = series(snap)
    hist = snap["history"]
    sim = snap.get("backend") != "driver"
    records = _Records()
    when = time.strftime("%Y-%m-%d %H:%M:%S",
                         time.localtime(snap.get("time", 0)))
    out = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
           "<title>cudamem memory snapshot</title>",
           "<style>%s</style></head><body>" % _CSS,
           "<h1>cudamem memory snapshot</h1>",
           "<p>taken %s on the %s backend%s. History: %s, %d events "
           "recorded, %d dropped (ring of %d)%s.</p>" % (
               _e(when), _e(snap.get("backend")),
               ' <span class="sim">(SIMULATED: CPU simulator)</span>'
               if sim else "",
               "on" if hist["enabled"] else "off", hist["recorded"],
               hist["dropped"], hist["max_entries"],
               ", with stacks" if hist["stacks"] else "")]
    oom = snap.get("oom")
    if oom:
        out.append('<h2>Out of memory</h2><p id="oom">%s</p>'
                   % _e(oom.get("message", "")))
    out.append("<h2>Devices</h2><table><tr><th class=l>device</th>"
               "<th class=l>manager</th><th>allocated</th><th>peak</th>"
               "<th>allocations</th><th>pool reserved</th><th>pool free"
               "</th><th>pinned</th></tr>")
    for d in snap.get("devices", []):
        st = d["stats"]
        out.append("<tr><td class=l>%d</td><td class=l>%s</td><td>%s</td>"
                   "<td>%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s"
                   "</td></tr>" % (
                       d["device"], _e(d["manager"]),
                       _fmt_bytes(st["allocated_bytes"]),
                       _fmt_bytes(st["peak_allocated_bytes"]),
                       st["allocation_count"],
                       _fmt_bytes(st["pool_reserved_bytes"]),
                       _fmt_bytes(st["pool_free_bytes"]),
                       _fmt_bytes(st["pinned_bytes"])))
    out.append("</table>")
    t0 = _t_first(snap)
    ooms = [(e["time"] - t0, e) for e in hist["entries"]
            if e["action"] == "oom"]
    snames = stream_names(snap)
    svg, legend = _timeline_svg(ser, ooms, records, snames)
    out.append("<h2>Live bytes over time</h2>")
    if len(hist["entries"]) == 0:
        out.append("<p>No history recorded: call "
                   "<code>cudamem.memory_history(True)</code> before the "
                   "allocations of interest.</p>")
    else:
        out.append('<p class="hint">Point at the timeline for the live '
                   'bytes at that moment; point at or click a block or an '
                   'out-of-memory mark for its size and stack.</p>')
    out.append(svg + legend)
    live = {(b["device"], b["address"]): b for b in snap["live"]
            if b["kind"] == "device"}
    frag = [_segments_svg(d, live, records, snames)
            for d in snap.get("devices", [])]
    frag = [f for f in frag if f]
    out.append("<h2>Pool segments</h2>")
    out.append("".join(frag) if frag else
               "<p>No pool segments (the pool manager is not in use).</p>")
    out.append("<h2>Largest live allocations</h2><table id=\"largest\"><tr>"
               "<th>size</th><th class=l>kind</th><th>device</th>"
               "<th class=l>stream</th><th class=l>address</th>"
               "<th class=l>allocated at</th></tr>")
    for b in snap["live"][:50]:
        h = b.get("stream") or 0
        out.append("<tr><td>%s</td><td class=l>%s</td><td>%d</td>"
                   "<td class=l%s>%s</td><td class=l>0x%x</td><td class=l>"
                   "%s</td></tr>" % (
                       _fmt_bytes(b["size"]), _e(b["kind"]), b["device"],
                       ' title="stream handle 0x%x"' % h if h else "",
                       _e(snames.get(h, "stream")), b["address"],
                       _stack_html(b.get("stack"))))
    out.append("</table>")
    names = [k for k in ser if k != "total"] + ["total"]
    data = json.dumps({"series": ser, "order": names,
                       "allocs": records.allocs,
                       "stacks": records.stacks}).replace("</", "<\\/")
    out.append('<script type="application/json" id="memviz-data">%s'
               '</script>' % data)
    out.append('<div id="tip"></div><div id="detail"><button '
               'id="detail-close" title="close">&#215;</button><pre '
               'id="detail-text"></pre></div><script>%s</script></body>'
               '</html>' % _JS)
    return "\n".join(out)


def write_html(snap, path):
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(snap))


def write_png(snap, path):
    """A static timeline of live bytes per series (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ser = series(snap)
    fig, ax = plt.subplots(figsize=(11, 5))
    i = 0
    for k, pts in ser.items():
        color = "black" if k == "total" else _COLORS[i % len(_COLORS)]
        i += k != "total"
        ax.step([p[0] for p in pts], [p[1] / 2**20 for p in pts],
                where="post", label=k,
                linewidth=2 if k == "total" else 1.2, color=color)
    # The out-of-memory errors of the history: a dashed red line each,
    # as on the page.
    t0 = _t_first(snap)
    ooms = [e["time"] - t0 for e in snap["history"]["entries"]
            if e["action"] == "oom"]
    for j, t in enumerate(ooms):
        ax.axvline(t, color=OOM_COLOR, linestyle="--", linewidth=2,
                   label="out of memory" if j == 0 else None)
    if ooms:
        ax.annotate("OOM", xy=(ooms[0], 1.0), xycoords=("data",
                                                        "axes fraction"),
                    xytext=(-2, 2), textcoords="offset points",
                    ha="right", va="bottom", color=OOM_COLOR)
    ax.set_xlabel("seconds since the first recorded event")
    ax.set_ylabel("live MiB")
    title = "cudamem memory timeline"
    if snap.get("backend") != "driver":
        title += " (SIMULATED)"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"ooms": ooms, "series": list(ser)}
