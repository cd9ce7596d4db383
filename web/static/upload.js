// The upload page: an archive (or a folder, packed here as an uncompressed tar) dropped or picked, sent as the raw
// body of POST /models/NAME/upload with XMLHttpRequest (whose upload events drive the progress bar; fetch has none),
// then the server's answer shown: the model and version installed, or each problem the archive has.
"use strict";

(() => {
  const form = document.getElementById("upload-form");
  if (!form) return;
  const nameInput = document.getElementById("model-name");
  const fileInput = document.getElementById("archive-file");
  const folderInput = document.getElementById("archive-folder");
  const activate = document.getElementById("activate");
  const button = document.getElementById("upload-button");
  const dropzone = document.getElementById("dropzone");
  const chosenText = document.getElementById("chosen");
  const progressBox = document.getElementById("upload-progress-box");
  const progress = document.getElementById("upload-progress");
  const progressText = document.getElementById("upload-progress-text");
  const result = document.getElementById("upload-result");
  const encoder = new TextEncoder();
  // What will be sent: {body: Blob, label: text naming it, type: its Content-Type}.
  let chosen = null;
  let sending = false;

  // --- sizes ------------------------------------------------------------------------------------------------

  const UNITS = [["GiB", 1024 ** 3], ["MiB", 1024 ** 2], ["KiB", 1024]];

  function unitFor(total) {
    for (const [unit, size] of UNITS) if (total >= size) return [unit, size];
    return ["KiB", 1024];
  }

  // "3.2 of 10.0 MiB": both in the unit of the total.
  function ofTotal(sent, total) {
    const [unit, size] = unitFor(total);
    return `${(sent / size).toFixed(1)} of ${(total / size).toFixed(1)} ${unit}`;
  }

  function sizeText(total) {
    const [unit, size] = unitFor(total);
    return `${(total / size).toFixed(1)} ${unit}`;
  }

  // --- a folder as a tar (ustar) ----------------------------------------------------------------------------

  function writeOctal(header, offset, length, value) {
    // length - 1 octal digits, then NUL.
    const text = value.toString(8).padStart(length - 1, "0");
    if (text.length > length - 1) throw new Error("a file is too large for a tar archive (8 GiB each at most)");
    header.set(encoder.encode(text), offset);
    header[offset + length - 1] = 0;
  }

  // A path over 100 bytes is split at a "/" into the 155-byte prefix and the 100-byte name, as ustar allows.
  function splitPath(path) {
    const bytes = encoder.encode(path);
    if (bytes.length <= 100) return [new Uint8Array(0), bytes];
    for (let i = Math.min(155, bytes.length - 2); i > 0; i--) {
      if (bytes[i] === 0x2f && bytes.length - i - 1 <= 100) return [bytes.slice(0, i), bytes.slice(i + 1)];
    }
    throw new Error(`the path ${path} is too long for a tar archive`);
  }

  function tarHeader(path, size, mtimeSeconds) {
    const header = new Uint8Array(512);
    const [prefix, name] = splitPath(path);
    header.set(name, 0);
    writeOctal(header, 100, 8, 0o644); // mode
    writeOctal(header, 108, 8, 0); // uid
    writeOctal(header, 116, 8, 0); // gid
    writeOctal(header, 124, 12, size);
    writeOctal(header, 136, 12, Math.max(0, Math.floor(mtimeSeconds)));
    header.fill(0x20, 148, 156); // the checksum counts its own field as spaces
    header[156] = 0x30; // "0": a regular file
    header.set(encoder.encode("ustar\0"), 257);
    header.set(encoder.encode("00"), 263);
    header.set(prefix, 345);
    let sum = 0;
    for (const byte of header) sum += byte;
    writeOctal(header, 148, 7, sum);
    header[155] = 0x20;
    return header;
  }

  // entries: [{path, file}]; the files are referenced by the Blob, never read into memory here.
  function packTar(entries) {
    const parts = [];
    for (const { path, file } of entries) {
      parts.push(tarHeader(path, file.size, file.lastModified / 1000), file);
      const padding = (512 - (file.size % 512)) % 512;
      if (padding) parts.push(new Uint8Array(padding));
    }
    parts.push(new Uint8Array(1024)); // two zero blocks end the archive
    return new Blob(parts, { type: "application/x-tar" });
  }

  function chooseFolder(entries) {
    if (!entries.length) {
      showChosen(null, "That folder holds no files.");
      return;
    }
    entries.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
    const folder = entries[0].path.split("/")[0];
    let body;
    try {
      body = packTar(entries);
    } catch (error) {
      showChosen(null, error.message);
      return;
    }
    const files = entries.length === 1 ? "1 file" : `${entries.length} files`;
    showChosen({ body, type: "application/x-tar", label: `folder ${folder}/ (${files}, ${sizeText(body.size)})` }, null,
      folder);
  }

  // A dropped folder, walked through the entries API (its files' paths start with the folder's name).
  async function walk(entry, found) {
    if (entry.isFile) {
      const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
      found.push({ path: entry.fullPath.replace(/^\/+/, ""), file });
      return;
    }
    const reader = entry.createReader();
    for (;;) {
      const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
      if (!batch.length) break;
      for (const child of batch) await walk(child, found);
    }
  }

  // --- choosing ---------------------------------------------------------------------------------------------

  function archiveType(name) {
    const lower = name.toLowerCase();
    if (lower.endsWith(".zip")) return "application/zip";
    if (lower.endsWith(".tar")) return "application/x-tar";
    return "application/gzip";
  }

  function chooseFile(file) {
    const stem = file.name.replace(/(\.tar\.gz|\.tgz|\.tar|\.zip)$/i, "");
    showChosen({ body: file, type: archiveType(file.name), label: `${file.name} (${sizeText(file.size)})` }, null,
      stem);
  }

  function showChosen(next, problem, suggestedName) {
    chosen = next;
    chosenText.textContent = next ? `Chosen: ${next.label}` : problem || "Nothing chosen yet.";
    if (next && suggestedName && !nameInput.value.trim()) nameInput.value = suggestedName;
    button.disabled = !next || sending;
  }

  fileInput.addEventListener("change", () => {
    if (fileInput.files.length) {
      folderInput.value = "";
      chooseFile(fileInput.files[0]);
    }
  });

  folderInput.addEventListener("change", () => {
    if (!folderInput.files.length) return;
    fileInput.value = "";
    const entries = Array.from(folderInput.files, (file) => ({ path: file.webkitRelativePath || file.name, file }));
    chooseFolder(entries);
  });

  for (const type of ["dragenter", "dragover"]) {
    dropzone.addEventListener(type, (event) => {
      event.preventDefault();
      dropzone.classList.add("over");
    });
  }
  dropzone.addEventListener("dragleave", () => dropzone.classList.remove("over"));
  dropzone.addEventListener("drop", async (event) => {
    event.preventDefault();
    dropzone.classList.remove("over");
    const items = Array.from(event.dataTransfer.items || []);
    const entry = items.length === 1 && items[0].webkitGetAsEntry ? items[0].webkitGetAsEntry() : null;
    if (entry && entry.isDirectory) {
      const found = [];
      try {
        await walk(entry, found);
      } catch (error) {
        showChosen(null, `That folder could not be read: ${error.message}`);
        return;
      }
      chooseFolder(found);
      return;
    }
    const files = event.dataTransfer.files;
    if (files.length !== 1) {
      showChosen(null, "Drop one archive or one folder.");
      return;
    }
    chooseFile(files[0]);
  });

  // --- sending ----------------------------------------------------------------------------------------------

  function setProgress(sent, total) {
    progress.max = total || 1;
    progress.value = Math.min(sent, progress.max);
    progressText.textContent = ofTotal(sent, total);
  }

  function element(tag, className, text) {
    const made = document.createElement(tag);
    if (className) made.className = className;
    if (text !== undefined) made.textContent = text;
    return made;
  }

  // "model/config.pbtxt:3:17: ..." shows its place in the config apart from what is wrong there.
  const CONFIG_PLACE = /^(\S*config\.pbtxt:\d+(?::\d+)?):?\s*(.*)$/s;

  function problemItem(problem) {
    const item = element("li");
    const place = CONFIG_PLACE.exec(problem);
    if (place) {
      item.append(element("code", "", place[1]), ` ${place[2]}`);
    } else {
      item.textContent = problem;
    }
    return item;
  }

  function showResult(status, answer, text) {
    result.replaceChildren();
    if (status === 200 && answer) {
      const box = element("div", "notice");
      box.setAttribute("role", "status");
      const what = answer.created ? "a new model" : "its next version";
      let state = answer.loaded ? "It is loaded and serving." : "It is installed, not loaded.";
      if (answer.probation_s) {
        state += ` It is on probation for ${Math.round(answer.probation_s)} s: if it fails (a crash, too many failed requests), it is removed again and the version before serves. Unloading, loading or activating the model meanwhile ends the probation, and the upload stays.`;
      }
      box.append(element("p", "", `Model ${answer.model} version ${answer.version} installed as ${what}. ${state}`));
      const link = element("a", "", `Open model ${answer.model}`);
      link.href = `/models/${encodeURIComponent(answer.model)}`;
      const line = element("p");
      line.append(link);
      box.append(line);
      result.append(box);
      return;
    }
    const box = element("div", "alert");
    box.setAttribute("role", "alert");
    let problems = [];
    if (answer && answer.problems && answer.problems.length) problems = answer.problems;
    else if (answer && answer.error) problems = [answer.error];
    else if (status === 413) problems = ["The archive is larger than this server takes (its --upload-max-bytes)."];
    else if (status === 403) problems = ["Not allowed: your session may have expired, or your role may not upload. Reload the page."];
    else if (status === 0) problems = ["The upload was cut off before the server answered (the connection closed)."];
    else problems = [`The server answered ${status}: ${(text || "").trim().slice(0, 300)}`];
    const count = problems.length === 1 ? "1 problem" : `${problems.length} problems`;
    box.append(element("p", "", `The upload was refused (${count}); nothing was changed on the device.`));
    const list = element("ul", "problems");
    for (const problem of problems) list.append(problemItem(problem));
    box.append(list);
    result.append(box);
  }

  function finish() {
    sending = false;
    form.removeAttribute("aria-busy");
    nameInput.disabled = false;
    fileInput.disabled = false;
    folderInput.disabled = false;
    activate.disabled = false;
    button.disabled = !chosen;
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (sending || !chosen) return;
    const name = nameInput.value.trim();
    if (!name) {
      showResult(400, { problems: ["Enter the model's name: a new one, or the name of the model to add a version to."] });
      nameInput.focus();
      return;
    }
    sending = true;
    form.setAttribute("aria-busy", "true");
    for (const control of [nameInput, fileInput, folderInput, activate, button]) control.disabled = true;
    result.replaceChildren();
    progressBox.hidden = false;
    const total = chosen.body.size;
    setProgress(0, total);

    const request = new XMLHttpRequest();
    request.open("POST", `/models/${encodeURIComponent(name)}/upload?activate=${activate.checked ? "true" : "false"}`);
    request.setRequestHeader("Content-Type", chosen.type);
    request.setRequestHeader("X-CSRF-Token", form.dataset.csrfToken);
    request.upload.addEventListener("progress", (progressEvent) => {
      setProgress(progressEvent.loaded, progressEvent.lengthComputable ? progressEvent.total : total);
    });
    request.upload.addEventListener("load", () => {
      setProgress(total, total);
      progressText.textContent = `${ofTotal(total, total)} sent: checking and installing…`;
    });
    request.addEventListener("load", () => {
      let answer = null;
      if ((request.getResponseHeader("Content-Type") || "").startsWith("application/json")) {
        try {
          answer = JSON.parse(request.responseText);
        } catch (_error) {
          answer = null;
        }
      }
      if (request.status === 200) {
        setProgress(total, total);
      }
      progressText.textContent = ofTotal(progress.value, total);
      showResult(request.status, answer, request.responseText);
      finish();
    });
    request.addEventListener("error", () => {
      showResult(0, null, "");
      finish();
    });
    request.send(chosen.body);
  });
})();
