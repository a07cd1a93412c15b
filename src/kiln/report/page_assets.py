"""The page's style sheet and script, inlined in every report (no file beside it, no network).

The script does one thing: a click on a drawn node shows that node's op, operand and result
types, attributes and kernel in the panel beside the pictures (hover shows the short form,
from each node's SVG title). The node data is a JSON block in the page, keyed by SVG id.
"""

STYLE = """
:root { --ink: #222; --muted: #666; --line: #ddd; --panel: #f7f7f9; }
* { box-sizing: border-box; }
body { font-family: Helvetica, Arial, sans-serif; color: var(--ink); margin: 0;
       background: #fff; font-size: 14px; }
header { padding: 14px 24px; background: #1f2937; color: #f9fafb; }
header h1 { margin: 0 0 4px 0; font-size: 20px; }
header p { margin: 2px 0; color: #d1d5db; }
nav a { color: #93c5fd; margin-right: 14px; text-decoration: none; }
main { padding: 8px 24px 40px 24px; }
section { margin: 18px 0 28px 0; }
h2 { font-size: 17px; border-bottom: 2px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 10px 0 6px 0; }
.note { color: var(--muted); font-size: 12px; margin: 4px 0 8px 0; }
.warning { background: #fff4e5; border: 1px solid #f5c67a; padding: 8px 12px;
           border-radius: 4px; }
.pictures { display: flex; gap: 12px; align-items: flex-start; }
.picture { flex: 1 1 0; min-width: 0; border: 1px solid var(--line); border-radius: 4px; }
.picture h3 { margin: 0; padding: 6px 10px; background: var(--panel);
              border-bottom: 1px solid var(--line); }
.canvas { overflow: auto; max-height: 78vh; padding: 6px; }
.canvas.fit svg { width: 100%; height: auto; }
.canvas svg g.node { cursor: pointer; }
.canvas svg g.node.selected polygon, .canvas svg g.node.selected path,
.canvas svg g.node.selected ellipse { stroke: #d62728; stroke-width: 2.5px; }
aside.node-details { flex: 0 0 300px; position: sticky; top: 8px; background: var(--panel);
                     border: 1px solid var(--line); border-radius: 4px; padding: 8px 10px;
                     font-size: 12px; max-height: 78vh; overflow: auto; }
aside.node-details pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0 8px 0; }
aside.node-details dt { font-weight: bold; color: var(--muted); }
aside.node-details dd { margin: 0 0 6px 0; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; margin: 4px 0 8px 0; }
.legend span.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #777;
                      border-radius: 2px; vertical-align: -2px; margin-right: 4px; }
button.fit { font-size: 11px; float: right; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 4px; text-align: left;
         vertical-align: top; }
th { background: var(--panel); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.where { font-family: monospace; font-size: 12px; max-width: 640px; }
.timebar { display: inline-block; height: 9px; background: #4e79a7; vertical-align: middle; }
details pre { background: #f6f8fa; border: 1px solid var(--line); padding: 8px;
              max-height: 420px; overflow: auto; font-size: 12px; }
td.code { max-width: 760px; }
td.code pre { max-width: 760px; }
.kind { padding: 1px 6px; border-radius: 3px; border: 1px solid #999; font-size: 12px; }
"""

SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('kiln-node-data').textContent);
  var FIELDS = [['op', 'op'], ['outputs', 'result'], ['inputs', 'operands'],
                ['attributes', 'attributes'], ['kernel', 'kernel'], ['types', 'types']];
  function show(panel, id) {
    var info = data[id];
    if (!info) { return; }
    panel.textContent = '';
    var title = document.createElement('h3');
    title.textContent = info.title;
    panel.appendChild(title);
    var list = document.createElement('dl');
    FIELDS.forEach(function (field) {
      if (!info[field[0]]) { return; }
      var dt = document.createElement('dt');
      dt.textContent = field[1];
      var dd = document.createElement('dd');
      var pre = document.createElement('pre');
      pre.textContent = info[field[0]];
      dd.appendChild(pre);
      list.appendChild(dt);
      list.appendChild(dd);
    });
    panel.appendChild(list);
  }
  document.querySelectorAll('.pictures').forEach(function (pictures) {
    var panel = pictures.querySelector('aside.node-details');
    pictures.querySelectorAll('svg g.node').forEach(function (node) {
      node.addEventListener('click', function () {
        pictures.querySelectorAll('g.node.selected').forEach(function (other) {
          other.classList.remove('selected');
        });
        node.classList.add('selected');
        show(panel, node.id);
      });
    });
  });
  document.querySelectorAll('button.fit').forEach(function (button) {
    button.addEventListener('click', function () {
      var canvas = button.parentElement.parentElement.querySelector('.canvas');
      canvas.classList.toggle('fit');
      button.textContent = canvas.classList.contains('fit') ? 'actual size' : 'fit width';
    });
  });
})();
"""
