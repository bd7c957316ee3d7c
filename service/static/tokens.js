// Sentencepiece pieces → readable text, and pieces → words (the same grouping as model/tokenizer.py).

export const WORD_BOUNDARY = "\u2581"; // ▁ marks the start of a word

export function isSpecial(piece) {
  return piece.length > 2 && piece.startsWith("<") && piece.endsWith(">");
}

function isCjkChar(character) {
  const code = character.codePointAt(0);
  return (
    (code >= 0x3400 && code <= 0x9fff) ||
    (code >= 0xf900 && code <= 0xfaff) ||
    (code >= 0x3000 && code <= 0x303f) ||
    (code >= 0xff00 && code <= 0xffef) ||
    (code >= 0x20000 && code <= 0x2fa1f)
  );
}

export function isCjk(text) {
  return text.length > 0 && [...text].every(isCjkChar);
}

/** What a piece looks like on screen: ▁ dropped ("␣" when the piece is only a space). */
export function pieceLabel(piece) {
  if (isSpecial(piece)) return piece;
  const text = piece.replaceAll(WORD_BOUNDARY, "");
  return text === "" ? "␣" : text;
}

/** Whether a piece continues the previous word (drawn joined to it). */
export function continuesWord(pieces, index) {
  const piece = pieces[index];
  if (index === 0 || isSpecial(piece) || piece.startsWith(WORD_BOUNDARY)) return false;
  const previous = pieces[index - 1];
  const text = piece.replaceAll(WORD_BOUNDARY, "");
  return !isCjk(text) && !isSpecial(previous) && !isCjk(previous.replaceAll(WORD_BOUNDARY, ""));
}

/** A piece that is the word boundary alone: the space before the word that follows it. */
export function isLoneSpace(piece) {
  return piece === WORD_BOUNDARY;
}

/**
 * Group piece indices into words: a new word at each ▁, around CJK pieces and special tokens; a lone ▁
 * joins the word that follows it (model/tokenizer.py's word_groups).
 */
export function wordGroups(pieces) {
  const groups = [];
  let spaces = [];
  let previousCjk = false;
  pieces.forEach((piece, index) => {
    const special = isSpecial(piece);
    if (isLoneSpace(piece)) {
      spaces.push(index);
      return;
    }
    if (spaces.length && special) {
      if (groups.length) groups[groups.length - 1].push(...spaces);
      else groups.push(spaces);
      spaces = [];
    }
    const text = piece.replace(/^\u2581+/, "");
    const cjk = isCjk(text);
    if (!groups.length || spaces.length || special || piece.startsWith(WORD_BOUNDARY) || cjk || previousCjk) groups.push([...spaces, index]);
    else groups[groups.length - 1].push(index);
    spaces = [];
    previousCjk = cjk || special;
  });
  if (spaces.length) groups.push(spaces);
  return groups;
}

export function wordLabel(pieces, group) {
  const text = group.map((i) => pieces[i]).join("").replaceAll(WORD_BOUNDARY, " ").trim();
  return text || pieceLabel(pieces[group[0]]);
}

/**
 * A token-level view of one explanation: labels, a T×S matrix, alignment pairs and log-probabilities.
 * Word view: a target word's row is the mean of its pieces' rows (a lone ▁ left out); a source word's column
 * is the sum of its pieces' columns (attention mass), so rows still sum to 1. Log-probabilities of a word add up.
 */
export function buildView(mode, sourcePieces, targetPieces, matrix, alignment, tokenScores) {
  if (mode !== "words") {
    return {
      source: sourcePieces.map((p, i) => ({ label: pieceLabel(p), raw: p, pieces: [i], cont: continuesWord(sourcePieces, i), special: isSpecial(p) })),
      target: targetPieces.map((p, i) => ({ label: pieceLabel(p), raw: p, pieces: [i], cont: continuesWord(targetPieces, i), special: isSpecial(p) })),
      matrix,
      alignment: alignment.map(([s, t]) => [s, t]),
      logprobs: tokenScores ? [...tokenScores] : null,
    };
  }
  const sourceGroups = wordGroups(sourcePieces);
  const targetGroups = wordGroups(targetPieces);
  const sourceWordOf = new Map();
  sourceGroups.forEach((g, w) => g.forEach((i) => sourceWordOf.set(i, w)));
  const targetWordOf = new Map();
  targetGroups.forEach((g, w) => g.forEach((i) => targetWordOf.set(i, w)));
  const words = targetGroups.map((tg) => {
    // a lone ▁ is part of its word's text, not of what the word attends to (unless it is the whole word)
    const spoken = tg.filter((t) => !isLoneSpace(targetPieces[t]));
    const rows = spoken.length ? spoken : tg;
    return sourceGroups.map((sg) => {
      let total = 0;
      for (const t of rows) for (const s of sg) total += matrix[t][s];
      return total / rows.length;
    });
  });
  const seen = new Set();
  const pairs = [];
  for (const [s, t] of alignment) {
    const pair = [sourceWordOf.get(s), targetWordOf.get(t)];
    const key = pair.join(",");
    if (pair[0] !== undefined && pair[1] !== undefined && !seen.has(key)) {
      seen.add(key);
      pairs.push(pair);
    }
  }
  const describe = (pieces) => (g) => ({ label: wordLabel(pieces, g), raw: g.map((i) => pieces[i]).join(" "), pieces: g, cont: false, special: g.length === 1 && isSpecial(pieces[g[0]]) });
  return {
    source: sourceGroups.map(describe(sourcePieces)),
    target: targetGroups.map(describe(targetPieces)),
    matrix: words,
    alignment: pairs,
    logprobs: tokenScores ? targetGroups.map((g) => g.reduce((sum, i) => sum + tokenScores[i], 0)) : null,
  };
}

/** cross_attention[layer][head] (T×S), or the mean over heads when head is "avg". */
export function headMatrix(crossAttention, layer, head) {
  const heads = crossAttention[layer];
  if (head !== "avg") return heads[Number(head)];
  const rows = heads[0].length;
  const cols = rows ? heads[0][0].length : 0;
  const mean = Array.from({ length: rows }, () => new Array(cols).fill(0));
  for (const h of heads) for (let t = 0; t < rows; t++) for (let s = 0; s < cols; s++) mean[t][s] += h[t][s] / heads.length;
  return mean;
}

/**
 * The rows the heatmap shows. "predicts": row t is the decoding step that predicts target token t (the
 * raw cross_attention). "reads": row t is the next step, where token t is the decoder's input (Chen et al.
 * 2020); the last row repeats, as the service's shifted alignment reads it (model/alignment.shift_rows).
 */
export function displayedRows(matrix, rows) {
  if (rows !== "reads" || matrix.length <= 1) return matrix;
  return [...matrix.slice(1), matrix[matrix.length - 1]];
}
