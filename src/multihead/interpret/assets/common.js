// multihead: what the report and the head view both need, inlined before either script.
// Weights arrive as report_html.pack_weights writes them: base64 of the deflated high-byte then
// low-byte planes of uint16 values in units of `unit`.
window.MultiheadCommon = window.MultiheadCommon || (function () {
  "use strict";
  async function unpack(b64, n, unit) {  // report_html.pack_weights, reversed
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    const planes = new Uint8Array(await new Response(stream).arrayBuffer());
    if (planes.length !== 2 * n) throw new Error(`weights: expected ${2 * n} bytes, got ${planes.length}`);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = (planes[i] * 256 + planes[n + i]) * unit;  // high, low
    return out;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  return {unpack, el};
})();
