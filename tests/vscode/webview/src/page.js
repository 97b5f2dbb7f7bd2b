// The notebook webview of VS Code's Jupyter extension, as far as widgets go, on one page.
//
// Two halves talk only through `post` (JSON text, delivered asynchronously and in order,
// as VS Code's webview.postMessage does):
// - the "extension host": one real websocket to a kernel on a loopback jupyter server. It
//   relays every kernel frame to the webview as vscode-jupyter's ipyWidgetMessageDispatcher
//   does (text frames as they are; binary frames through serializeDataViews, i.e. a JSON
//   array of byte values), runs cells, and tells the renderer to draw each widget output.
// - the "webview": a @jupyterlab/services KernelConnection on a fake websocket (vscode-jupyter's
//   ProxyKernel), the widget manager of @vscode/jupyter-ipywidgets8 on it, widget modules
//   from the kernel environment's share/jupyter/nbextensions through requireJS (its
//   scriptManager), and a renderer that draws each output (a widget view by renderWidget).
// Page -> kernel messages go to the kernel's shell channel as vscode-jupyter sends them:
// at once, whatever the kernel's state (webview kernel.ts ProxyWebSocket.send posts every
// frame while sendEnabled, which only a mirrored execute turns off; the extension host's
// ipyWidgetMessageDispatcher.sendRawPayloadToKernelSocket -> sendPendingMessages ->
// kernel.sendShellMessage, no busy check). The fallback is tested too: opened with
// ?drop=busy, or with window.msmonDrop set, comm messages sent while the kernel is busy
// are dropped (what a front end that does not deliver them would do).
// window.msmonReopen() draws the outputs the "extension host" kept, as VS Code draws a
// notebook reopened without a kernel: a widget output whose model the kernel does not
// have falls back to the output's next mime type (renderer/index.ts FallbackRenderer).
//
// Not here: VS Code's extension host process and its real webview (an iframe with its own
// CSP), message hooks and mirrored execute requests (output widgets need them; anywidget
// does not), the ipywidgets 7 bundle.
import { KernelMessage, ServerConnection } from "@jupyterlab/services";
import { KernelConnection } from "@jupyterlab/services/lib/kernel/default";

const WIDGET_MIMETYPE = "application/vnd.jupyter.widget-view+json";
const query = new URLSearchParams(location.search);
const server = query.get("server"); // http://127.0.0.1:PORT
const token = query.get("token");
const kernelId = query.get("kernel");
window.msmonDrop = query.get("drop") === "busy"; // may be switched on by the test
const clientId = crypto.randomUUID();

// what the test reads
const probe = (window.msmonProbe = {
  relayMs: [], // per kernel -> page frame: serialize + JSON + deserialize
  relayBytes: [],
  relayKinds: [], // per frame: its msg_type ("comm_msg" for the panel's updates)
  dropped: 0, // page -> kernel comm messages dropped while busy
  sentComms: 0,
  sentBusy: 0, // page -> kernel comm messages sent (and delivered) while the kernel was busy
  outputs: [], // the cell outputs as the extension host keeps them: {displayId, data}
  kernel: "unknown", // execution_state from the kernel's status messages
  replies: {}, // execute msg_id -> status
  errors: [],
  log: [],
});
window.addEventListener("error", (e) => probe.errors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => probe.errors.push(String(e.reason)));

// --- vscode-jupyter src/platform/common/utils/serializers.ts ----------------------------
function serializeDataViews(buffers) {
  const out = [];
  for (const item of buffers) {
    if ("buffer" in item && "byteOffset" in item) {
      out.push({ byteLength: item.byteLength, byteOffset: item.byteOffset,
                 buffer: Array.apply(null, new Uint8Array(item.buffer)) });
    } else {
      out.push([...new Uint8Array(item)]);
    }
  }
  return out;
}

function deserializeDataViews(buffers) {
  return buffers.map((item) =>
    "buffer" in item && "byteOffset" in item
      ? new DataView(new Uint8Array(item.buffer).buffer, item.byteOffset, item.byteLength)
      : new Uint8Array(item).buffer,
  );
}

// --- the post office: JSON text, asynchronous, in order ------------------------------------
function mailbox(deliver) {
  const channel = new MessageChannel();
  channel.port1.onmessage = (ev) => {
    const t0 = performance.now();
    deliver(JSON.parse(ev.data), t0);
  };
  return (type, payload) => channel.port2.postMessage(JSON.stringify({ type, payload }));
}

// --- extension host ------------------------------------------------------------------------
const wsBase = server.replace(/^http/, "ws");
const host = new WebSocket(
  `${wsBase}/api/kernels/${kernelId}/channels?session_id=${clientId}&token=${token}`,
);
host.binaryType = "arraybuffer";
let toWebview = null; // set once the webview half is up; frames wait until then
const early = [];

function relay(type, payload) {
  if (toWebview) toWebview(type, payload);
  else early.push([type, payload]);
}

// what the notebook document holds: each display's newest data, in display order
function keepOutput(kind, content) {
  if (kind === "stream") return;
  const displayId = content.transient?.display_id ?? "";
  const kept = displayId ? probe.outputs.find((o) => o.displayId === displayId) : null;
  if (kept) kept.data = content.data;
  else if (kind === "display_data") probe.outputs.push({ displayId, data: content.data });
}

host.onmessage = (ev) => {
  const t0 = performance.now();
  const seq = probe.relayMs.push(0) - 1;
  if (typeof ev.data === "string") {
    relay("IPyWidgets_msg", { seq, data: ev.data });
    const msg = JSON.parse(ev.data);
    const kind = msg.header.msg_type;
    if (kind === "status") probe.kernel = msg.content.execution_state;
    if (kind === "execute_reply") probe.replies[msg.parent_header.msg_id] = msg.content.status;
    // the outputs the extension host writes into the cell, which the renderer then draws
    if (kind === "display_data" || kind === "update_display_data" || kind === "stream") {
      relay("output", { kind, content: msg.content });
      keepOutput(kind, msg.content);
    }
  } else {
    relay("IPyWidgets_binary_msg", { seq, data: serializeDataViews([ev.data]) });
  }
  probe.relayMs[seq] += performance.now() - t0; // the host's half; the webview adds its own
  const header = typeof ev.data === "string" ? ev.data : new TextDecoder().decode(ev.data);
  probe.relayBytes[seq] = typeof ev.data === "string" ? ev.data.length : ev.data.byteLength;
  probe.relayKinds[seq] = /"msg_type":\s*"(\w+)"/.exec(header)?.[1] ?? "?";
};

const toHost = mailbox(({ type, payload }) => {
  if (type === "IPyWidgets_msg") host.send(payload.data);
  else if (type === "IPyWidgets_binary_msg") host.send(deserializeDataViews(payload.data)[0]);
});

// run a cell the way the extension host does: its own execute_request on its own socket
window.msmonRun = (code) => {
  const msg = KernelMessage.createMessage({
    msgType: "execute_request",
    channel: "shell",
    session: clientId,
    content: { code, silent: false, store_history: true, user_expressions: {},
               allow_stdin: false, stop_on_error: true },
  });
  host.send(JSON.stringify(msg));
  return msg.header.msg_id;
};

// --- webview: vscode-jupyter src/webviews/webview-side/ipywidgets/kernel/kernel.ts -----------
let proxySocket = null;
class ProxyWebSocket {
  constructor() {
    this.protocol = "";
    this.onopen = null;
    this.onmessage = null;
    proxySocket = this;
  }
  close() {}
  send(data) {
    const busy = probe.kernel === "busy";
    if (typeof data === "string") {
      if (data.includes('"comm_msg"')) {
        probe.sentComms += 1;
        if (window.msmonDrop && busy) {
          probe.dropped += 1;
          return;
        }
        if (busy) probe.sentBusy += 1;
      }
      toHost("IPyWidgets_msg", { data });
    } else {
      if (window.msmonDrop && busy) {
        probe.dropped += 1;
        return;
      }
      if (busy) probe.sentBusy += 1;
      toHost("IPyWidgets_binary_msg", { data: serializeDataViews([data]) });
    }
  }
}

const settings = ServerConnection.makeSettings({
  WebSocket: ProxyWebSocket,
  wsUrl: "ws://bogus-pvsc",
  baseUrl: server,
  token,
});
const kernel = new KernelConnection({
  serverSettings: settings,
  clientId,
  handleComms: true,
  username: "msmon-test",
  model: { id: kernelId, name: "python3" },
});
// kernel.ts fakeOpenSocket: the "socket" is open at once and kernel info is not awaited
const realInfo = kernel.requestKernelInfo.bind(kernel);
kernel.requestKernelInfo = () => {
  kernel.requestKernelInfo = realInfo;
  return Promise.resolve();
};
proxySocket.onopen({ target: proxySocket });
kernel.requestKernelInfo = realInfo;

function toProxy(type, payload, t0) {
  if (type === "IPyWidgets_msg") {
    proxySocket.onmessage({ target: proxySocket, data: payload.data, type: "" });
  } else if (type === "IPyWidgets_binary_msg") {
    const data = deserializeDataViews(payload.data)[0];
    proxySocket.onmessage({ target: proxySocket, data, type: "" });
  }
  probe.relayMs[payload.seq] += performance.now() - t0;
}

// --- widget manager: @vscode/jupyter-ipywidgets8 and its script loader ------------------------
const nbextensions = new URL("nbextensions/", location.href).href; // the kernel env's folder
const scriptLoader = {
  widgetsRegisteredInRequireJs: new Set(),
  errorHandler: (cls, mod, ver, err) => probe.errors.push(`load ${mod}@${ver}.${cls}: ${err}`),
  successHandler: (cls, mod, ver) => probe.log.push(`loaded ${mod}@${ver}.${cls}`),
  async loadWidgetScript(moduleName) {
    // scriptManager + requirejsRegistry: <prefix>/share/jupyter/nbextensions/<module>/index.js
    window.requirejs.config({ paths: { [moduleName]: `${nbextensions}${moduleName}/index` } });
    this.widgetsRegisteredInRequireJs.add(moduleName);
  },
};

async function renderWidget(manager, data, el) {
  const model = await manager.get_model(data.model_id);
  const view = await manager.create_view(model, { el });
  return manager.display_view(data, view, { node: el });
}

// One output, drawn by its richest type as VS Code does (a widget view if there is one);
// update_display_data replaces the output with that display_id.
function drawOutput(manager, { kind, content }, outputs = document.getElementById("outputs")) {
  if (kind === "stream") {
    const pre = document.createElement("pre");
    pre.className = "cell-stream";
    pre.textContent = content.text;
    outputs.appendChild(pre);
    return;
  }
  const displayId = content.transient?.display_id ?? "";
  let el = displayId ? outputs.querySelector(`[data-display-id="${displayId}"]`) : null;
  if (kind === "update_display_data" && !el) return;
  if (!el) {
    el = document.createElement("div");
    el.className = "cell-output";
    el.dataset.displayId = displayId;
    outputs.appendChild(el);
  }
  el.replaceChildren();
  const data = content.data;
  el.dataset.mime = data[WIDGET_MIMETYPE] ? WIDGET_MIMETYPE
    : data["image/png"] ? "image/png" : data["text/html"] ? "text/html" : Object.keys(data)[0];
  if (data[WIDGET_MIMETYPE] && manager) {
    renderWidget(manager, data[WIDGET_MIMETYPE], el).catch((err) =>
      probe.errors.push(`render: ${err}`),
    );
  } else if (data["image/png"]) {
    const img = document.createElement("img");
    img.src = `data:image/png;base64,${data["image/png"]}`;
    el.appendChild(img);
  } else if (data["text/html"]) {
    el.innerHTML = data["text/html"]; // VS Code's html renderer: styles apply, no script here
  } else {
    const pre = document.createElement("pre");
    pre.textContent = data["text/plain"] ?? "";
    el.appendChild(pre);
  }
}

async function start() {
  const bundle = await import(new URL("ipywidgets.js", location.href).href);
  bundle.activate();
  window.vscIPyWidgets8.load();
  const manager = new window.vscIPyWidgets.WidgetManager(
    kernel,
    document.getElementById("outputs"),
    scriptLoader,
    (line) => probe.log.push(line),
  );
  toWebview = mailbox(({ type, payload }, t0) => {
    if (type === "output") {
      drawOutput(manager, payload);
    } else {
      toProxy(type, payload, t0);
    }
  });
  for (const [type, payload] of early.splice(0)) toWebview(type, payload);
  await new Promise((resolve, reject) => {
    if (host.readyState === WebSocket.OPEN) resolve();
    host.onopen = resolve;
    host.onerror = () => reject(new Error("the kernel websocket did not open"));
  });
  window.msmonReady = true;
}

// A notebook reopened without a kernel: the saved outputs, drawn as VS Code draws them.
// The widget renderer asks the extension whether the kernel holds the model
// ("query-widget-state"); with no kernel it throws vscode.fallbackToNextRenderer and VS
// Code renders the output's next mime type: the picture, else the text.
window.msmonReopen = () => {
  const reopened = document.createElement("div");
  reopened.id = "reopened";
  document.body.appendChild(reopened);
  for (const { displayId, data } of probe.outputs) {
    const { [WIDGET_MIMETYPE]: _widget, ...rest } = data;
    drawOutput(null, { kind: "display_data",
      content: { data: rest, transient: { display_id: displayId } } }, reopened);
  }
  return [...reopened.children].map((el) => el.dataset.mime);
};

start().catch((err) => probe.errors.push(`start: ${err}`));
