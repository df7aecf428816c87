// IPython semantics, rich results and charts through the official
// @e2b/code-interpreter package, as E2B's Python kernel (IPython with
// E2B's formatters) gives them: indented cells, !cmd, %magics,
// IPython.display, objects' _repr_*_ methods, PIL images, a DataFrame's
// `data`, JSON for lists and dicts, and matplotlib figures with their
// structured `chart` (line, scatter, bar, pie, box-and-whisker,
// superchart, unknown). One sandbox serves the file.
import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'

import { Sandbox } from '@e2b/code-interpreter'

import { sandbox } from './helpers.mjs'

const T = { timeout: 90_000 }
let ci
// Two Python contexts: one left as plain Python until IPython is needed
// (the kernel's default) and one made IPython from the start; results
// must not depend on which.
const modes = {}

before(async () => {
  ci = await sandbox({ timeoutMs: 600_000 }, undefined, Sandbox)
  modes.python = await ci.createCodeContext()
  modes.ipython = await ci.createCodeContext()
  ok(await ci.runCode('get_ipython()', { context: modes.ipython }))
})

after(async () => {
  for (const ctx of Object.values(modes)) await ci.removeCodeContext(ctx).catch(() => {})
})

// ok asserts that ex has no error and returns it.
function ok(ex) {
  assert.equal(ex.error, undefined, ex.error && `${ex.error.name}: ${ex.error.value}\n${ex.error.traceback}`)
  return ex
}

const bytes = (b64) => Buffer.from(b64, 'base64')
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
const isPng = (b64) => typeof b64 === 'string' && bytes(b64).subarray(0, 8).equals(PNG_MAGIC)

// withContext runs fn with a fresh Python context, removed after.
async function withContext(fn) {
  const ctx = await ci.createCodeContext()
  try {
    return await fn(ctx)
  } finally {
    await ci.removeCodeContext(ctx)
  }
}

describe('IPython', () => {
  test('an indented cell', T, async () => {
    // IPython removes the first line's indentation (LLMs send code so).
    const ex = ok(await ci.runCode('\n    a = 20\n    if a:\n        b = a + 1\n    b * 2\n'))
    assert.equal(ex.text, '42')
  })

  test('!cmd', T, async () => {
    assert.equal(ok(await ci.runCode('!pwd')).logs.stdout.join(''), '/home/user\n')
    assert.equal(ok(await ci.runCode("files = !ls /\n'etc' in files")).text, 'True')
    assert.equal((await ci.runCode('!exit 3\n_exit_code')).text, '3')
  })

  test('%magics and IPython\'s error shapes', T, async () => {
    await withContext(async (context) => {
      const run = (code) => ci.runCode(code, { context })
      ok(await run('%cd /tmp'))
      assert.equal(ok(await run('import os; os.getcwd()')).text, '/tmp')
      ok(await run('%env CF_MAGIC=on'))
      assert.equal(ok(await run("os.environ['CF_MAGIC']")).text, 'on')
      assert.match(ok(await run('%time t = sum(range(10))')).logs.stdout.join(''), /Wall time/)
      assert.deepEqual(ok(await run('%%bash\necho from bash')).logs.stdout, ['from bash\n'])
      ok(await run("get_ipython().run_line_magic('env', 'CF_M2=x')"))
      const ex = await run('1 / 0')
      assert.deepEqual([ex.error?.name, ex.error?.value], ['ZeroDivisionError', 'division by zero'])
      assert.match(ex.error.traceback, /ZeroDivisionError/)
    })
  })

  test('IPython.display', T, async () => {
    let ex = ok(await ci.runCode("from IPython.display import display\ndisplay({'text/latex': r'\\text{CustomReprObject}'}, raw=True)"))
    assert.deepEqual(ex.results.map((r) => r.formats()), [['latex']])
    assert.equal(ex.results[0].latex, '\\text{CustomReprObject}')
    ex = ok(await ci.runCode("from IPython.display import HTML, Markdown\ndisplay(HTML('<b>x</b>'))\nMarkdown('# t')"))
    assert.deepEqual(ex.results.map((r) => [r.html ?? r.markdown, r.isMainResult]), [['<b>x</b>', false], ['# t', true]])
    assert.equal(ex.results[1].markdown, '# t')
  })

  const REPRS = `
class AllReprs:
    def _repr_html_(self): return '<i>h</i>'
    def _repr_markdown_(self): return '**m**'
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"/>'
    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\n'
    def _repr_jpeg_(self): return b'\\xff\\xd8\\xff'
    def _repr_pdf_(self): return b'%PDF-1.4'
    def _repr_latex_(self): return r'$\\alpha$'
    def _repr_json_(self): return {'k': [1, 2]}
    def _repr_javascript_(self): return 'console.log(1)'
    def __repr__(self): return 'AllReprs()'
`

  for (const mode of ['python', 'ipython']) {
    describe(`in a ${mode} context`, () => {
      test('_repr_*_ methods', T, async () => {
        const context = modes[mode]
        ok(await ci.runCode(REPRS, { context }))
        const ex = ok(await ci.runCode('AllReprs()', { context }))
        assert.equal(ex.results.length, 1)
        const [r] = ex.results
        assert.equal(r.isMainResult, true)
        assert.equal(r.text, 'AllReprs()')
        assert.deepEqual([r.html, r.markdown, r.latex, r.javascript], ['<i>h</i>', '**m**', '$\\alpha$', 'console.log(1)'])
        assert.match(r.svg, /^<svg/)
        assert.ok(bytes(r.png).equals(PNG_MAGIC))
        assert.ok(bytes(r.jpeg).equals(Buffer.from([0xff, 0xd8, 0xff])))
        assert.equal(bytes(r.pdf).toString(), '%PDF-1.4')
        assert.deepEqual(r.json, { k: [1, 2] })
        assert.deepEqual(r.extra, {})
        // display() gives the same, as a display result.
        const shown = ok(await ci.runCode('display(AllReprs())', { context }))
        assert.equal(shown.results[0].isMainResult, false)
        assert.equal(shown.results[0].latex, '$\\alpha$')
      })

      test('JSON for lists and dicts', T, async () => {
        const context = modes[mode]
        const ex = ok(await ci.runCode("import numpy as np\n{'a': np.arange(3), 1: [1.5, None]}", { context }))
        assert.deepEqual(ex.results[0].json, { a: [0, 1, 2], 1: [1.5, null] })
        assert.equal(ok(await ci.runCode("'a string'", { context })).results[0].json, undefined)
      })

      test('a DataFrame\'s data', T, async () => {
        const ex = ok(await ci.runCode(`
          import pandas as pd
          pd.DataFrame({"a": [1, 2, 3], "when": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"])})
        `, { context: modes[mode] }))
        const [r] = ex.results
        assert.deepEqual(r.data, {
          a: [1, 2, 3], when: ['2024-01-01T00:00:00', '2024-01-02T00:00:00', '2024-01-03T00:00:00'],
        })
        assert.match(r.html, /<table/)
        assert.match(r.text, /when/)
        assert.ok(r.formats().includes('data'))
      })

      const IMAGE = `
    import numpy
    from PIL import Image
    imarray = numpy.random.rand(16, 16, 3) * 255
    image = Image.fromarray(imarray.astype('uint8')).convert('RGBA')
`
      for (const how of ['image.show()', "image.save('cf-test.png')", 'image']) {
        test(`a PIL image: ${how}`, T, async () => {
          const ex = ok(await ci.runCode(`${IMAGE}    ${how}\n`, { context: modes[mode] }))
          assert.equal(ex.results.length, 1, JSON.stringify(ex.results.map((r) => r.formats())))
          assert.ok(isPng(ex.results[0].png))
          assert.equal(ex.results[0].isMainResult, how === 'image')
        })
      }
    })
  }
})

// chartOf runs code that shows one figure and returns its chart.
async function chartOf(code) {
  const ex = ok(await ci.runCode(code))
  const figures = ex.results.filter((r) => r.png)
  assert.equal(figures.length, 1, JSON.stringify(ex.results.map((r) => r.formats())))
  const [r] = figures
  assert.ok(isPng(r.png))
  assert.match(r.text, /^<Figure/)
  assert.deepEqual(r.extra, {})
  assert.ok(r.chart, 'the figure has a chart')
  return r.chart
}

describe('charts', () => {
  test('line', T, async () => {
    const chart = await chartOf(`
import datetime
import matplotlib.pyplot as plt
import numpy as np
dates = [datetime.date(2023, 9, 1) + datetime.timedelta(days=i) for i in range(30)]
plt.figure(figsize=(10, 6))
plt.plot(dates, np.sin(np.linspace(0, 6, 30)), label='sin(x)')
plt.plot(dates, np.cos(np.linspace(0, 6, 30)), label='cos(x)')
plt.xlabel('Time (s)')
plt.ylabel('Amplitude (Hz)')
plt.title('Plot of sin(x) and cos(x)')
plt.show()
`)
    assert.equal(chart.type, 'line')
    assert.equal(chart.title, 'Plot of sin(x) and cos(x)')
    assert.deepEqual([chart.x_label, chart.y_label, chart.x_unit, chart.y_unit], ['Time (s)', 'Amplitude (Hz)', 's', 'Hz'])
    assert.deepEqual([chart.x_scale, chart.y_scale], ['datetime', 'linear'])
    assert.deepEqual(chart.elements.map((e) => e.label), ['sin(x)', 'cos(x)'])
    assert.equal(chart.elements[0].points.length, 30)
    assert.match(chart.elements[0].points[0][0], /^2023-09-01/)
    assert.ok(Math.abs(chart.elements[1].points[0][1] - 1) < 1e-9, 'cos(0)')
    assert.ok(Array.isArray(chart.x_ticks) && Array.isArray(chart.y_tick_labels))
  })

  test('log and categorical scales', T, async () => {
    let chart = await chartOf(`
import matplotlib.pyplot as plt
import numpy as np
plt.plot(np.linspace(1, 10, 10), np.exp(np.linspace(1, 10, 10)), label='exp')
plt.yscale('log')
plt.show()
`)
    assert.deepEqual([chart.type, chart.y_scale], ['line', 'log'])
    chart = await chartOf("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], ['A', 'B', 'C'])\nplt.show()")
    assert.deepEqual([chart.type, chart.x_scale, chart.y_scale], ['line', 'linear', 'categorical'])
  })

  test('scatter', T, async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
import numpy as np
plt.xlabel("A")
plt.ylabel("B")
plt.scatter(np.random.rand(5), np.random.rand(5), c='blue', label='Dataset 1')
plt.scatter(np.random.rand(10), np.random.rand(10), c='red', label='Dataset 2')
plt.show()
`)
    assert.equal(chart.type, 'scatter')
    assert.deepEqual([chart.title ?? null, chart.x_label, chart.y_label], [null, 'A', 'B'])
    assert.deepEqual(chart.elements.map((e) => [e.label, e.points.length]), [['Dataset 1', 5], ['Dataset 2', 10]])
  })

  test('bar', T, async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
plt.bar(['A', 'B', 'C'], [100, 200, 300], label='Books Sold')
plt.xlabel('Authors')
plt.ylabel('Number of Books Sold')
plt.title('Book Sales by Authors')
plt.show()
`)
    assert.equal(chart.type, 'bar')
    assert.equal(chart.title, 'Book Sales by Authors')
    assert.deepEqual([chart.x_label, chart.y_label], ['Authors', 'Number of Books Sold'])
    assert.deepEqual(chart.elements.map((b) => [b.label, b.value, b.group]),
      [['A', 100, 'Books Sold'], ['B', 200, 'Books Sold'], ['C', 300, 'Books Sold']])
  })

  test('pie', T, async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.pie([90, 10], labels=["No", "Yes"], startangle=90)
plt.title('Will it rain?')
plt.show()
`)
    assert.equal(chart.type, 'pie')
    assert.equal(chart.title, 'Will it rain?')
    assert.deepEqual(chart.elements.map((e) => [e.label, e.angle, e.radius]), [['No', 324, 1], ['Yes', 36, 1]])
  })

  test('box and whisker', T, async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
data = {'Class A': [85, 90, 78, 92, 88], 'Class B': [95, 89, 76, 91, 84, 87], 'Class C': [75, 82, 88, 79, 86]}
fig, ax = plt.subplots()
ax.set_title('Exam Scores Distribution')
ax.set_xlabel('Class')
ax.set_ylabel('Score')
ax.boxplot(data.values(), labels=data.keys(), patch_artist=True)
plt.show()
`)
    assert.equal(chart.type, 'box_and_whisker')
    assert.equal(chart.title, 'Exam Scores Distribution')
    assert.deepEqual(chart.elements.map((b) => b.label), ['Class A', 'Class B', 'Class C'])
    assert.deepEqual(chart.elements.map((b) => b.median), [88, 88, 82])
    assert.deepEqual(chart.elements.map((b) => b.outliers), [[], [76], []])
    assert.deepEqual(chart.elements.map((b) => [b.min, b.max]), [[78, 92], [84, 95], [75, 88]])
    assert.deepEqual(chart.elements.map((b) => [b.first_quartile, b.third_quartile]), [[85, 90], [84.75, 90.5], [79, 86]])
  })

  test('superchart', T, async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
import numpy as np
fig, axs = plt.subplots(1, 2)
fig.suptitle('Multiple Charts Example')
axs[0].plot(np.linspace(0, 10, 100), np.sin(np.linspace(0, 10, 100)))
axs[0].set_title('Sine Wave')
axs[1].scatter(np.random.rand(5), np.random.rand(5))
axs[1].set_title('Scatter Plot')
plt.show()
`)
    assert.equal(chart.type, 'superchart')
    assert.equal(chart.title, 'Multiple Charts Example')
    assert.deepEqual(chart.elements.map((c) => [c.type, c.title]), [['line', 'Sine Wave'], ['scatter', 'Scatter Plot']])
    assert.equal(chart.elements[0].elements[0].points.length, 100)
  })

  test('unknown', T, async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, fill=False))
plt.title('Two Concentric Circles')
plt.show()
`)
    assert.equal(chart.type, 'unknown')
    assert.equal(chart.title, 'Two Concentric Circles')
    assert.deepEqual(chart.elements, [])
  })

  test('a figure is shown once; the cell\'s value comes after it', T, async () => {
    await withContext(async (context) => {
      const run = async (code) => ok(await ci.runCode(code, { context })).results.map((r) => [Boolean(r.png), r.isMainResult])
      // plt.show() displays the figure; the last expression is the value.
      assert.deepEqual(await run('import matplotlib.pyplot as plt\nfig = plt.figure()\nplt.plot([1, 2])\nplt.show()\n7'),
        [[true, false], [false, true]])
      // A figure that is the cell's value is shown once, as the value.
      const ex = ok(await ci.runCode('fig, ax = plt.subplots()\nax.plot([3, 1])\nfig', { context }))
      assert.deepEqual(ex.results.map((r) => [Boolean(r.png), r.isMainResult]), [[true, true]])
      assert.equal(ex.results[0].chart.type, 'line')
      // So with matplotlib's inline backend, which shows what a cell drew
      // when it ends.
      ok(await ci.runCode('%matplotlib inline', { context }))
      assert.deepEqual(await run("fig, ax = plt.subplots()\nax.bar(['a'], [1])\nfig"), [[true, true]])
      assert.deepEqual(await run('plt.plot([1, 2])\nplt.show()\n7'), [[true, false], [false, true]])
    })
  })
})
