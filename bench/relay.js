// VS Code's relay of a widget message to the notebook page (vscode-jupyter's
// serializeDataViews / deserializeDataViews, src/platform/common/utils/serializers.ts): the
// kernel's binary websocket frame becomes a JSON array of byte values, goes through JSON,
// and the page rebuilds it. Two branches, by what the extension host holds:
//   "arraybuffer": an ArrayBuffer (its kernel sockets use binaryType "arraybuffer", and raw
//                  kernels serialize to one), spread: [...new Uint8Array(buf)];
//   "view":        an ArrayBufferView (a Node Buffer), Array.apply(null, new Uint8Array(
//                  view.buffer)) over the view's whole underlying buffer.
// Reads "<bytes>\n" per message on stdin; prints "<bytes> <branch> <median ms> <max ms> <ok>".
const lines = require("fs").readFileSync(0, "utf8").trim().split("\n").filter(Boolean);
function serialize(item) {
  if ("buffer" in item && "byteOffset" in item) {
    return { byteOffset: item.byteOffset, byteLength: item.byteLength,
             buffer: Array.apply(null, new Uint8Array(item.buffer)) };
  }
  return [...new Uint8Array(item)];
}
function deserialize(item) {
  if ("buffer" in item && "byteOffset" in item) {
    return new DataView(new Uint8Array(item.buffer).buffer, item.byteOffset, item.byteLength);
  }
  return new Uint8Array(item).buffer;
}
const repeats = Number(process.argv[2] || 15);
for (const line of lines) {
  const bytes = Number(line);
  for (const branch of ["arraybuffer", "view"]) {
    const frame = branch === "view" ? new DataView(new ArrayBuffer(bytes)) : new ArrayBuffer(bytes);
    const times = [];
    let ok = true;
    for (let r = 0; r < repeats; r++) {
      const t0 = performance.now();
      try {
        deserialize(JSON.parse(JSON.stringify({ data: [serialize(frame)] })).data[0]);
      } catch (err) {
        ok = false;
        break;
      }
      times.push(performance.now() - t0);
    }
    times.sort((a, b) => a - b);
    const med = ok ? times[Math.floor(times.length / 2)] : NaN;
    const max = ok ? times[times.length - 1] : NaN;
    console.log(`${bytes} ${branch} ${med} ${max} ${ok}`);
  }
}
