//! The page: the drawing inline, the verdict as a table, an event's details on hover.
//! Everything is in the one file — no network, no external fonts, styles or scripts.

use std::fmt::Write;

use super::drawing::{Picture, Verdict};
use super::escape;

const STYLE: &str = "\
body{margin:0;background:#fff;color:#222;font-family:'DejaVu Sans','Liberation Sans',Arial,Helvetica,sans-serif}
main{max-width:1280px;margin:0 auto}
svg{display:block;width:100%;height:auto}
section{padding:0 12px 16px}
h2{font-size:15px;margin:8px 0}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#eee}
td:first-child{font-weight:bold}
tr.named td{background:#fbe3d6;color:#8a2b00;font-weight:bold}
pre{font-size:12px;margin:0;white-space:pre-wrap;font-family:'DejaVu Sans Mono','Liberation Mono',Consolas,monospace}
#tip{position:fixed;z-index:2;max-width:560px;padding:6px 8px;background:#fffbe6;border:1px solid #333;
border-radius:4px;font:12px/1.35 'DejaVu Sans Mono','Liberation Mono',Consolas,monospace;white-space:pre-wrap;
pointer-events:none;box-shadow:0 2px 6px rgba(0,0,0,.3)}
.note{font-size:12px;color:#555}
@media print{#tip,.note{display:none}}
";

/// Moves each mark's SVG `<title>` into the custom tooltip (so that the browser's own does
/// not show twice) and follows the pointer.
const SCRIPT: &str = "\
(function(){
var tip=document.getElementById('tip');
var marks=document.querySelectorAll('svg .ev, svg .bar, svg .believed, svg .freeze, svg .held, svg .overlap');
for(var i=0;i<marks.length;i++){var t=marks[i].querySelector('title');
if(t){marks[i].setAttribute('data-tip',t.textContent);t.parentNode.removeChild(t);}}
document.addEventListener('mousemove',function(e){
var el=e.target.closest?e.target.closest('[data-tip]'):null;
if(!el){tip.hidden=true;return;}
tip.textContent=el.getAttribute('data-tip');tip.hidden=false;
var x=e.clientX+14,y=e.clientY+14,r=tip.getBoundingClientRect();
if(x+r.width>window.innerWidth)x=Math.max(0,e.clientX-r.width-14);
if(y+r.height>window.innerHeight)y=Math.max(0,e.clientY-r.height-14);
tip.style.left=x+'px';tip.style.top=y+'px';});
})();
";

pub fn page(picture: &Picture) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<main>\n",
        escape(&picture.title)
    );
    out.push_str(&super::svg::inline(picture));
    out.push_str("<section class=\"verdict\">\n<h2>Verdict</h2>\n");
    match &picture.verdict {
        Verdict::Table { header, rows } => {
            out.push_str("<table>\n<tr>");
            for cell in header {
                let _ = write!(out, "<th>{}</th>", escape(cell));
            }
            out.push_str("</tr>\n");
            for row in rows {
                out.push_str("<tr>");
                for cell in row {
                    let _ = write!(out, "<td>{}</td>", escape(cell));
                }
                out.push_str("</tr>\n");
            }
            out.push_str("</table>\n");
        }
        Verdict::Text(lines) => {
            let _ = writeln!(out, "<pre>{}</pre>", escape(&lines.join("\n")));
        }
        Verdict::Findings {
            lines,
            header,
            rows,
            named,
        } => {
            let _ = writeln!(
                out,
                "<pre class=\"findings\">{}</pre>\n<h2>The database's log of changes</h2>\n<table class=\"changes\">\n<tr>",
                escape(&lines.join("\n"))
            );
            for cell in header {
                let _ = write!(out, "<th>{}</th>", escape(cell));
            }
            out.push_str("</tr>\n");
            for (row, named) in rows.iter().zip(named) {
                out.push_str(if *named {
                    "<tr class=\"named\">"
                } else {
                    "<tr>"
                });
                for cell in row {
                    let _ = write!(out, "<td>{}</td>", escape(cell));
                }
                out.push_str("</tr>\n");
            }
            out.push_str("</table>\n");
        }
        Verdict::Missing => out.push_str("<p>No verdict: the run did not finish.</p>\n"),
    }
    let _ = write!(
        out,
        "<p class=\"note\">{} events. Point at a mark, a bar or a band for its details.</p>\n\
         </section>\n</main>\n<div id=\"tip\" role=\"tooltip\" hidden></div>\n<script>\n{SCRIPT}</script>\n</body>\n</html>\n",
        picture.event_count
    );
    out
}
