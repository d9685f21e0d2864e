// Measures a lockslab picture in the browser that drew it (scripts/check-pictures injects
// this into a copy of the page and reads the result back with --dump-dom). Each fact is
// measured on the laid-out SVG (getBBox), not read from the markup:
//   overflow   texts that stick out of the drawing or out of their part's box
//   overlaps   pairs of labels in one part whose boxes cross (1px across, 3px down)
//   crammed    parts whose marks crowd: the densest 3% of the time axis holds more than
//              half of the part's marks (the decisive moments squeezed into a sliver)
//   stacked    marks of one lane at the same millisecond drawn on top of each other
//   slivers    lock bars drawn narrower than 10px
//   grid       cells in the guard × fault grid (lab 9's full run)
//   bands      partition or stall bands drawn
(function () {
  var svg = document.querySelector('svg');
  var out = {overflow: [], overlaps: [], crammed: [], stacked: [], slivers: 0, grid: 0, bands: 0, parts: 0};
  if (!svg) { report(); return; }
  var width = svg.viewBox.baseVal.width || 1280;
  var X0 = 150, X1 = 1230;
  function box(el) { try { return el.getBBox(); } catch (e) { return null; } }
  // The user-space box of an element, its transforms included (its ancestors' up to svg).
  function placed(el) {
    var b = box(el); if (!b) return null;
    var m = el.getCTM(), root = svg.getCTM();
    if (!m || !root) return b;
    var rel = root.inverse().multiply(m);
    var p1 = svg.createSVGPoint(), p2 = svg.createSVGPoint();
    p1.x = b.x; p1.y = b.y; p2.x = b.x + b.width; p2.y = b.y + b.height;
    p1 = p1.matrixTransform(rel); p2 = p2.matrixTransform(rel);
    return {x: Math.min(p1.x, p2.x), y: Math.min(p1.y, p2.y),
            w: Math.abs(p2.x - p1.x), h: Math.abs(p2.y - p1.y)};
  }
  function name(el) { return (el.textContent || '').slice(0, 40); }
  var texts = svg.querySelectorAll('text');
  for (var i = 0; i < texts.length; i++) {
    var b = placed(texts[i]);
    if (!b || b.w === 0) continue;
    if (b.x < -0.5 || b.x + b.w > width + 0.5) out.overflow.push(name(texts[i]) + ' (drawing)');
  }
  var parts = svg.querySelectorAll('g.part');
  out.parts = parts.length;
  for (var p = 0; p < parts.length; p++) {
    var part = parts[p];
    var frame = placed(part.querySelector('rect'));
    var labels = part.querySelectorAll('text.lbl, text.tick, text.gap-label, text.band-label, g.bar text');
    var boxes = [];
    for (var j = 0; j < labels.length; j++) {
      var lb = placed(labels[j]);
      if (!lb || lb.w === 0 || !labels[j].textContent.trim()) continue;
      if (frame && (lb.x < frame.x - 0.5 || lb.x + lb.w > frame.x + frame.w + 0.5))
        out.overflow.push(name(labels[j]) + ' (part ' + part.getAttribute('data-part') + ')');
      boxes.push([lb, labels[j]]);
    }
    for (var a = 0; a < boxes.length; a++) for (var c = a + 1; c < boxes.length; c++) {
      var u = boxes[a][0], v = boxes[c][0];
      var dx = Math.min(u.x + u.w, v.x + v.w) - Math.max(u.x, v.x);
      var dy = Math.min(u.y + u.h, v.y + v.h) - Math.max(u.y, v.y);
      // A text box holds its line gap too: rows 12px apart touch by ~1-2px without their
      // glyphs meeting, so a crossing counts from 3px down and 1px across.
      if (dx > 1 && dy > 3)
        out.overlaps.push(name(boxes[a][1]) + ' × ' + name(boxes[c][1]) + ' (' +
          part.getAttribute('data-part') + ', x ' + Math.round(u.x) + ', y ' + Math.round(u.y) + ')');
    }
    // Where the part's marks are: the densest 3% of the axis.
    var xs = [];
    var marks = part.querySelectorAll('g.ev');
    for (var k = 0; k < marks.length; k++) {
      var t = marks[k].transform.baseVal.consolidate();
      if (t) xs.push(t.matrix.e);
    }
    xs.sort(function (x, y) { return x - y; });
    var window = 0.03 * (X1 - X0), most = 0;
    for (var s = 0, e = 0; s < xs.length; s++) {
      while (e < xs.length && xs[e] - xs[s] <= window) e++;
      most = Math.max(most, e - s);
    }
    if (xs.length >= 6 && most > xs.length / 2)
      out.crammed.push(part.getAttribute('data-part') + ': ' + most + ' of ' + xs.length + ' marks in 3%');
  }
  // Marks of one lane at the same millisecond drawn on top of each other (a grant and the
  // kill of its holder): each must be seen.
  var lanes = svg.querySelectorAll('g.lane');
  for (var l = 0; l < lanes.length; l++) {
    var seen = {};
    var evs = lanes[l].querySelectorAll('g.ev');
    for (var q = 0; q < evs.length; q++) {
      var m = evs[q].transform.baseVal.consolidate();
      if (!m) continue;
      var t = evs[q].getAttribute('data-t'), x = m.matrix.e;
      (seen[t] = seen[t] || []).forEach(function (other) {
        if (Math.abs(other - x) < 6) out.stacked.push(lanes[l].getAttribute('data-lane') + ' at ' + t + 'ms');
      });
      seen[t].push(x);
    }
  }
  var held = svg.querySelectorAll('g.bar rect.held');
  for (var h = 0; h < held.length; h++) if (held[h].width.baseVal.value < 9.9) out.slivers++;
  out.grid = svg.querySelectorAll('g.grid a.cell').length;
  out.bands = svg.querySelectorAll('g.band').length;
  report();
  function report() {
    var pre = document.createElement('pre');
    pre.id = 'measured';
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
})();
